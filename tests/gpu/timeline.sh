#!/usr/bin/env bash
# timeline.sh (on the GPU machine, from the repo root): an Nsight Systems kernel trace of the proxy
# step, and tests/gpu/timeline_gaps.py's table of where the GPU idles between kernels. Runs
# `moetrain bench --layers $LAYERS --steps 4 --warmup 2` under nsys (CUDA trace only; where there is no
# nsys, under the CUPTI injection library tests/gpu/cupti/kernel_trace.cpp), exports the
# GPU trace as CSV and summarises the last $STEPS_KEEP steps. Bundle as for perf.sh (GPU_BIN).
# Env: GPU_BIN, LAYERS (4), SEQ (the bench's default, 4096), MT_BENCH_SET (extra --set overrides "k=v k=v"),
# MT_BENCH_SET_EXTRA (more of them, after MT_BENCH_SET: trace_ab.sh's VARIANTS can set it),
# STEPS_KEEP (2), GAPS_ARGS (more timeline_gaps.py options, e.g. "--ordinal gmm_ws_kernel": each expert
# y / dx GEMM launch of the step apart; trace_ab.sh passes it through).
# Results: $OUT/timeline.txt, $OUT/kernels.json (each kernel's us per step), $OUT/trace.csv.xz.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}
mkdir -p "$out"
work=$(mktemp -d /tmp/timeline.XXXXXX)
bin=${GPU_BIN:-gpu-bin-perf}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
carried=$bin
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p "$work/bundle" && tar -xJf "$bin/bundle.tar.xz" -C "$work/bundle" && bin=$work/bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
sets=()
for kv in ${MT_BENCH_SET:-} ${MT_BENCH_SET_EXTRA:-}; do sets+=(--set "$kv"); done
layers=${LAYERS:-4}
run=("$bin/moetrain" bench --layers "$layers" --steps 4 --warmup 2 ${SEQ:+--seq "$SEQ"} "${sets[@]}")
nsys=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [[ -n "$nsys" ]]; then
  "$nsys" profile -t cuda -s none --cpuctxsw=none -o "$work/rep" -f true "${run[@]}" > "$out/bench.log" 2>&1
  "$nsys" stats -r cuda_gpu_trace -f csv -o "$work/t" "$work/rep.nsys-rep" > /dev/null 2>&1
else  # CUPTI through an injection library (tests/gpu/cupti/kernel_trace.cpp), carried or built here
  so=$carried/kernel_trace.so
  [[ -f "$so" ]] || { so=$work/kernel_trace.so; g++ -O2 -shared -fPIC tests/gpu/cupti/kernel_trace.cpp \
    -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib -lcupti -o "$so" || exit 1; }
  CUDA_INJECTION64_PATH=$so MT_TRACE_CSV=$work/t_cuda_gpu_trace.csv "${run[@]}" > "$out/bench.log" 2>&1
fi
csv=$(ls "$work"/t*cuda_gpu_trace*.csv | head -1)
xz -T4 -c "$csv" > "$out/trace.csv.xz"
python3 tests/gpu/timeline_gaps.py "$csv" --layers "$layers" --steps "${STEPS_KEEP:-2}" --json "$out/kernels.json" ${GAPS_ARGS:-} \
  | tee "$out/timeline.txt"
