#!/usr/bin/env bash
# ab_bins.sh (on the GPU machine, from the repo root): the Qwen3-30B-A3B layer step of two builds in
# turn, in one call, to compare a change with the build before it (env_ab.sh compares settings of
# one build). BIN_A, BIN_B: bundles of stage_session.sh; ROUNDS (2) rounds of A then B; a run is
# skipped once fewer than 80 s of BUDGET_S (500) are left. SEQ (4096), MBS (1), MT_BENCH_SET
# (--set overrides, as perf.sh). Prints one line per run and a table of per-layer ms last; logs in
# $OUT/ab_bins/.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}/ab_bins
mkdir -p "$out"
t0=$(date +%s)
unpack() {  # bundle dir -> directory with moetrain
  local b=$1 dst=/tmp/ab_bins_$2
  case "$b" in /*) ;; *) b=$root/$b ;; esac
  if [[ -x "$b/moetrain" ]]; then echo "$b"; return; fi
  mkdir -p "$dst" && tar -xJf "$b/bundle.tar.xz" -C "$dst" && echo "$dst"
}
dir_a=$(unpack "${BIN_A:?BIN_A: a bundle directory}" a) || exit 1
dir_b=$(unpack "${BIN_B:?BIN_B: a bundle directory}" b) || exit 1
sets=()
for s in ${MT_BENCH_SET:-}; do sets+=(--set "$s"); done
rows=()
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in a b; do
    if (( $(date +%s) - t0 > ${BUDGET_S:-500} - 80 )); then echo "round $r $v: skipped (budget)"; continue; fi
    dir=$dir_a name=${BIN_A}
    [[ $v == b ]] && dir=$dir_b name=${BIN_B}
    log=$out/$v.r$r.log
    LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" timeout 170 "$dir/moetrain" bench \
      --layers 2,4 --seq "${SEQ:-4096}" --mbs "${MBS:-1}" "${sets[@]}" --json "$out/$v.r$r.json" > "$log" 2>&1
    rc=$?
    per=$(grep -o 'per layer [0-9.]* ms' "$log" | awk '{print $3}')
    peak=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(' '.join('%.2f/%.2f' % (r['peak_bytes']/2**30, (r.get('planned_peak_bytes') or -1)/2**30) for r in j.get('runs', [])))" "$out/$v.r$r.json" 2>/dev/null)
    echo "round $r $v ($name): rc $rc, per layer ${per:-?} ms, peak/plan GiB ${peak:-?}"
    rows+=("$(printf '%-3s %-18s %5s %8s  %s' "$v" "$name" "$r" "${per:-?}" "${peak:-?}")")
  done
done
echo
printf '%-3s %-18s %5s %8s  %s\n' run bundle round "ms/layer" "peak/plan GiB (2 / 4 layers)"
printf '%s\n' "${rows[@]}"
