#!/usr/bin/env bash
# perf.sh (on the GPU machine, from the repo root): issue 7's measurements in one call. Runs
# `moetrain bench` (Qwen3-30B-A3B 2/4-layer proxies at seq 4096 with --profile, seq 8192, micro-batch
# 2, kernels, dense Qwen3-0.6B) and, on the same GPU, torch_anchor.py and bench/torch_kernels.py,
# then prints tests/gpu/perf_table.py's ratio table last. Bundle: tests/gpu/stage_perf.sh (GPU_BIN,
# default gpu-bin-perf/, or gpu-bin-gs/ of stage_session.sh). Every step runs under `timeout` and a
# failed one is skipped. Env: BUDGET_S (520: later steps are skipped once it is spent),
# MT_BENCH_SET ("k=v k=v": extra seq-4096, seq-8192 and micro-batch-2 runs with these --set overrides,
# the last two beside torch.compile at the same shapes), SKIP_OURS, SKIP_TORCH,
# SKIP_COMPILE, SKIP_KERNELS, SKIP_DENSE, SKIP_8192, SKIP_MBS2 (=1 skips), ONLY (comma list of step
# names, e.g. ONLY=torch_s4096_mbs1_compile). Results: $OUT/perf_table.txt, $OUT/perf_results.json,
# $OUT/perf_logs.tar.gz (logs and every JSON).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
budget=${BUDGET_S:-520}
out=${OUT:-/tmp/moetrain-gpu-out}
mkdir -p "$out"
work=$(mktemp -d /tmp/perf-work.XXXXXX)
logs=$work/logs res=$work/res
mkdir -p "$logs" "$res"

bin=${GPU_BIN:-}
if [[ -z "$bin" ]]; then
  bin=$root/gpu-bin-perf
  [[ -e "$bin" ]] || bin=$root/gpu-bin-gs
fi
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p "$work/bundle" && tar -xJf "$bin/bundle.tar.xz" -C "$work/bundle" && bin=$work/bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
mt=$bin/moetrain
anchor=${ANCHOR:-}
for c in "$bin/torch_anchor.py" "$root/../shared/bench/torch_anchor.py"; do
  [[ -z "$anchor" && -f "$c" ]] && anchor=$c
done

declare -a status
note() { status+=("$1"); echo "== $1"; }
on() {  # on NAME [SKIP_VAR...]: should step NAME run?
  local name=$1; shift
  if [[ -n "${ONLY:-}" ]]; then [[ ",$ONLY," == *",$name,"* ]]; return; fi
  local v
  for v in "$@"; do [[ "${!v:-0}" == 1 ]] && return 1; done
  return 0
}
# step NAME LIMIT CMD...: CMD under timeout (LIMIT or what is left of the budget), output in logs/NAME.log.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( budget - $(elapsed) ))
  if (( left < 30 )); then note "$(printf '%-26s skipped: budget spent (%d s)' "$name" "$(elapsed)")"; return 1; fi
  (( limit > left )) && limit=$left
  local s=$(date +%s)
  timeout --kill-after=15 "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-26s exit %3d after %4d s (limit %d s)' "$name" "$rc" $(( $(date +%s) - s )) "$limit")"
  return $rc
}
ours() {  # ours NAME LIMIT BENCH_ARGS...
  local name=$1 limit=$2; shift 2
  if [[ ! -x "$mt" ]]; then note "$name skipped: no moetrain in $bin"; return; fi
  step "$name" "$limit" "$mt" bench "$@" --json "$res/$name.json"
  tail -3 "$logs/$name.log"
}
torch_run() {  # torch_run NAME LIMIT VAR=VALUE...: torch_anchor.py with that environment
  local name=$1 limit=$2; shift 2
  if [[ -z "$anchor" ]]; then note "$name skipped: no torch_anchor.py (bundle or ../shared/bench)"; return; fi
  mkdir -p "$work/$name"
  step "$name" "$limit" env OUT="$work/$name" "$@" python3 "$anchor"
  # Its JSON at the end, or (killed by the timeout, or MODEL=dense06) the last JSON line it printed.
  if [[ -f "$work/$name/torch_anchor.json" ]]; then
    cp "$work/$name/torch_anchor.json" "$res/$name.json"
  else
    grep '^{' "$logs/$name.log" | tail -1 > "$res/$name.json"
    [[ -s "$res/$name.json" ]] || rm -f "$res/$name.json"
  fi
  grep -E 'ms/step|failed' "$logs/$name.log" | tail -4
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$res/gpu.txt" 2>&1
note "gpu: $(head -1 "$res/gpu.txt") | moetrain: $mt | anchor: ${anchor:-none}"
sets=()
for s in ${MT_BENCH_SET:-}; do sets+=(--set "$s"); done

if on ours_s4096_mbs1 SKIP_OURS; then ours ours_s4096_mbs1 180 --layers 2,4 --seq 4096 --mbs 1 --profile; fi
if on torch_s4096_mbs1 SKIP_TORCH; then torch_run torch_s4096_mbs1 180 IMPLS=grouped_mm SEQ=4096 MBS=1; fi
if (( ${#sets[@]} )) && on ours_s4096_mbs1_set SKIP_OURS; then
  ours ours_s4096_mbs1_set 180 --layers 2,4 --seq 4096 --mbs 1 --profile "${sets[@]}"
fi
if on ours_s8192_mbs1 SKIP_OURS SKIP_8192; then ours ours_s8192_mbs1 150 --layers 2,4 --seq 8192 --mbs 1; fi
if on ours_s4096_mbs2 SKIP_OURS SKIP_MBS2; then ours ours_s4096_mbs2 150 --layers 2,4 --seq 4096 --mbs 2; fi
if (( ${#sets[@]} )) && on ours_s8192_mbs1_set SKIP_OURS SKIP_8192; then
  ours ours_s8192_mbs1_set 150 --layers 2,4 --seq 8192 --mbs 1 "${sets[@]}"
fi
if (( ${#sets[@]} )) && on ours_s4096_mbs2_set SKIP_OURS SKIP_MBS2; then
  ours ours_s4096_mbs2_set 150 --layers 2,4 --seq 4096 --mbs 2 "${sets[@]}"
fi
if on ours_kernels SKIP_OURS SKIP_KERNELS; then ours ours_kernels 150 --kernels --no-steps --seq 4096; fi
if on ours_dense06 SKIP_OURS SKIP_DENSE; then
  ours ours_dense06 150 --model qwen3-0.6b --layers 28 --seq 4096 --mbs 4
fi
if on torch_s8192_mbs1 SKIP_TORCH SKIP_8192; then torch_run torch_s8192_mbs1 180 IMPLS=grouped_mm SEQ=8192 MBS=1; fi
if on torch_s4096_mbs2 SKIP_TORCH SKIP_MBS2; then torch_run torch_s4096_mbs2 180 IMPLS=grouped_mm SEQ=4096 MBS=2; fi
if on torch_kernels SKIP_TORCH SKIP_KERNELS; then
  step torch_kernels 150 python3 bench/torch_kernels.py --tokens 4096 --seqs 4096 --reps 10 --json "$res/torch_kernels.json"
fi
if on torch_dense06 SKIP_TORCH SKIP_DENSE; then
  # Eager, then compiled, in one process; with SKIP_COMPILE the timeout ends it after the eager line.
  if [[ "${SKIP_COMPILE:-0}" == 1 ]]; then lim=100; else lim=240; fi
  torch_run torch_dense06 "$lim" MODEL=dense06 SEQ=4096 MBS=4
fi
if on torch_s4096_mbs1_compile SKIP_TORCH SKIP_COMPILE; then
  torch_run torch_s4096_mbs1_compile 600 IMPLS=grouped_mm+compile SEQ=4096 MBS=1
fi
if on torch_s8192_mbs1_compile SKIP_TORCH SKIP_COMPILE SKIP_8192; then
  torch_run torch_s8192_mbs1_compile 600 IMPLS=grouped_mm+compile SEQ=8192 MBS=1
fi
if on torch_s4096_mbs2_compile SKIP_TORCH SKIP_COMPILE SKIP_MBS2; then
  torch_run torch_s4096_mbs2_compile 600 IMPLS=grouped_mm+compile SEQ=4096 MBS=2
fi

python3 tests/gpu/perf_table.py "$res" --json "$out/perf_results.json" > "$out/perf_table.txt" 2>&1
note "perf_table.py exit $? ($(elapsed) s in all)"
(cd "$work" && tar -czf "$out/perf_logs.tar.gz" logs res)
echo
echo "=============== perf.sh steps ==============="
printf '%s\n' "${status[@]}"
echo
cat "$out/perf_table.txt"
rm -rf "$work"
