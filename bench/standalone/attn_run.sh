#!/bin/bash
# Device-machine driver of the attention harness: builds attn_bench.so (unless a prebuilt one is
# given as $1), runs the fp64 checks and timings (attn_bench.py), then a few ncu metrics of the
# old and warp-specialized kernels at T 4096. Logs go to $OUT (or /tmp/attn_out).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attn_out}
mkdir -p "$OUT"
LIB=${1:-/tmp/attn_bench.so}
if [ -z "$1" ]; then
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Isrc -shared -Xcompiler -fPIC \
    bench/standalone/attn_bench.cu -o "$LIB" || exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout ${BENCH_TIMEOUT:-170} python3 bench/standalone/attn_bench.py --lib "$LIB" --reps 30 --log "$OUT/attn.log" \
  2>&1 | tee "$OUT/bench.txt"
rc=$?
if [ -n "$NCU" ] && command -v ncu >/dev/null; then
  for m in 0 1; do
    timeout ${NCU_TIMEOUT:-30} ncu --kernel-name regex:'attn_(fwd|bwd)_(ws|wgmma|fused)' --section SpeedOfLight --section WarpStateStats \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      python3 bench/standalone/attn_bench.py --lib "$LIB" --once $m > "$OUT/ncu_$m.txt" 2>&1
    grep -E "attn_|hmma|Duration|Stall|Throughput|Warp Cycles" "$OUT/ncu_$m.txt" | head -40
  done
fi
exit $rc
