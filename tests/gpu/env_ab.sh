#!/usr/bin/env bash
# env_ab.sh (on the GPU machine, from the repo root): the Qwen3-30B-A3B layer step under several
# environments, in turn, in one call, to compare settings of one build (benchmark knobs such as
# MT_FUSED_ADAMW, MT_GEMM_KERNEL, or --set keys through MT_BENCH_SET).
# Env: GPU_BIN (bundle of stage_session.sh), VARIANTS ("name:K=V,K=V name2:..."; "base:" for none;
# an item "set:section.key=value" is a --set override of that variant instead of a variable),
# ROUNDS (2), SEQ (4096), MBS (1), MT_BENCH_SET (--set overrides, as perf.sh). Prints one line per
# run and a table of per-layer ms last; logs in $OUT/env_ab/.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}/env_ab
mkdir -p "$out"
bin=${GPU_BIN:-gpu-bin-lead}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p /tmp/env_ab_bundle && tar -xJf "$bin/bundle.tar.xz" -C /tmp/env_ab_bundle && bin=/tmp/env_ab_bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
sets=()
for s in ${MT_BENCH_SET:-}; do sets+=(--set "$s"); done
rows=()
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-base:}; do
    name=${v%%:*} envs=${v#*:}
    IFS=, read -ra items <<< "$envs"
    kv=() vsets=()
    for it in "${items[@]}"; do
      if [[ $it == set:* ]]; then vsets+=(--set "${it#set:}"); else kv+=("$it"); fi
    done
    log=$out/$name.r$r.log
    timeout 170 env "${kv[@]}" "$bin/moetrain" bench --layers 2,4 --seq "${SEQ:-4096}" --mbs "${MBS:-1}" \
      "${sets[@]}" "${vsets[@]}" --json "$out/$name.r$r.json" > "$log" 2>&1
    rc=$?
    per=$(grep -o 'per layer [0-9.]* ms' "$log" | awk '{print $3}')
    steps=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(' '.join('%.2f' % r['step_ms'] for r in j.get('runs', [])))" "$out/$name.r$r.json" 2>/dev/null)
    peak=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(' '.join('%.2f/%.2f' % (r['peak_bytes']/2**30, (r.get('planned_peak_bytes') or -1)/2**30) for r in j.get('runs', [])))" "$out/$name.r$r.json" 2>/dev/null)
    echo "round $r $name ($envs): rc $rc, per layer ${per:-?} ms, steps ${steps:-?} ms, peak/plan GiB ${peak:-?}"
    rows+=("$(printf '%-14s %-46s %8s  %-13s %s' "$name" "$envs" "${per:-?}" "${steps:-?}" "${peak:-?}")")
  done
done
printf '\n%-14s %-46s %8s  %-13s %s\n' variant env ms/layer "step ms 2L 4L" "peak/plan GiB (2L, 4L)"
printf '%s\n' "${rows[@]}"
