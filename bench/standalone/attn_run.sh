#!/bin/bash
# Device-machine driver of the attention harness: builds attn_bench.so (unless a prebuilt one is
# given as $1), runs the fp64 checks and timings (attn_bench.py), then (NCU=1) a few ncu metrics of
# the sm80 and warp-specialized kernels at T 4096. A reference build ($2, or REF=<git rev> built from
# `git archive`) must give bitwise equal outputs and is timed beside. Logs go to $OUT (or /tmp/attn_out).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attn_out}
mkdir -p "$OUT"
LIB=${1:-/tmp/attn_bench.so}
REF_LIB=${2:-}
build() {  # $1: tree holding src/ and bench/, $2: the .so
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -I"$1/src" -shared -Xcompiler -fPIC \
    "$1/bench/standalone/attn_bench.cu" -o "$2"
}
if [ -z "$1" ]; then build . "$LIB" || exit 1; fi
if [ -z "$REF_LIB" ] && [ -n "$REF" ]; then
  ref_dir=$(mktemp -d)
  git archive "$REF" src/kernels/cuda bench/standalone/attn_bench.cu | tar -x -C "$ref_dir" || exit 1
  REF_LIB=$ref_dir/attn_ref.so
  build "$ref_dir" "$REF_LIB" || exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout ${BENCH_TIMEOUT:-170} python3 bench/standalone/attn_bench.py --lib "$LIB" ${REF_LIB:+--ref-lib "$REF_LIB"} \
  --reps 30 --log "$OUT/attn.log" 2>&1 | tee "$OUT/bench.txt"
rc=$?
if [ -n "$NCU" ] && command -v ncu >/dev/null; then
  for arch in 80 90; do
    timeout ${NCU_TIMEOUT:-30} ncu --kernel-name regex:'attn_(fwd|bwd|dq|dkdv)_' --section SpeedOfLight \
      --section WarpStateStats --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      python3 bench/standalone/attn_bench.py --lib "$LIB" --once $arch > "$OUT/ncu_$arch.txt" 2>&1
    grep -E "attn_|hmma|Duration|Stall|Throughput|Warp Cycles" "$OUT/ncu_$arch.txt" | head -40
  done
fi
exit $rc
