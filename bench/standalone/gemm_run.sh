#!/usr/bin/env bash
# Device-machine driver for bench/standalone/gemm_bench.cu: builds the harness (TUs in parallel),
# counts HGMMA / bulk copies in the SASS, times torch._grouped_mm on the same shapes, then checks
# and times ours. Usage (repo root, on the GPU machine): bash bench/standalone/gemm_run.sh [reps]
# [ncu]. Logs go to $OUT.
set -o pipefail
OUT=${OUT:-/tmp/gemm_out}
B=/tmp/gemm_build
mkdir -p "$OUT" $B
export PATH=/usr/local/cuda/bin:$PATH
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
for f in bench/standalone/gemm_bench.cu src/kernels/cuda/grouped_gemm_mma.cu src/kernels/cuda/grouped_gemm_wgmma.cu; do
  nvcc $FLAGS -Xptxas -v -c "$f" -o "$B/$(basename "$f").o" > "$OUT/build_$(basename "$f").log" 2>&1 &
done
wait
nvcc -gencode=arch=compute_90a,code=sm_90a $B/gemm_bench.cu.o $B/grouped_gemm_mma.cu.o $B/grouped_gemm_wgmma.cu.o \
  -o $B/gemm_bench || { cat "$OUT"/build_*.log; exit 1; }
grep -h -E "registers|spill|C75" "$OUT"/build_grouped_gemm_wgmma.cu.log | sort | uniq -c | head -20
cuobjdump --dump-sass $B/gemm_bench > $B/sass.txt
echo "SASS: HGMMA $(grep -c HGMMA $B/sass.txt), bulk copies $(grep -c UBLKCP $B/sass.txt)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PYTHONUNBUFFERED=1 python3 bench/standalone/gemm_torch.py "${1:-20}" 2>&1 | tee "$OUT/torch.log"
$B/gemm_bench "${1:-20}" > "$OUT/bench.log" 2>&1
echo "bench rc $?"; grep -E "^\||FAIL|PASS|determinism" "$OUT/bench.log"
if [ "${2:-}" = ncu ]; then  # profile the wgmma dW (f32 +=, bf16 +=, bf16 =) and one wgmma fwd
  ncu --clock-control none -k regex:gmm_ --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats $B/gemm_bench 1 prof > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_]*gmm|Duration|DRAM Throughput|L2 Cache Throughput|Issued Warp|Warp Cycles Per Issued" "$OUT/ncu.txt" | head -40
fi
