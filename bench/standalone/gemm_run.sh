#!/usr/bin/env bash
# Device-machine driver for bench/standalone/gemm_bench.cu: builds the harness (3 TUs in parallel),
# counts HGMMA in the SASS, times torch._grouped_mm on the same shapes, then checks and times ours.
# Usage (repo root, on the GPU machine): bash bench/standalone/gemm_run.sh [reps]; logs go to $OUT.
set -o pipefail
OUT=${OUT:-/tmp/gemm_out}
mkdir -p "$OUT" /tmp/gemm_build
export PATH=/usr/local/cuda/bin:$PATH
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
for f in bench/standalone/gemm_bench.cu src/kernels/cuda/grouped_gemm_mma.cu src/kernels/cuda/grouped_gemm_wgmma.cu; do
  nvcc $FLAGS -Xptxas -v -c "$f" -o "/tmp/gemm_build/$(basename "$f").o" > "$OUT/build_$(basename "$f").log" 2>&1 &
done
wait
nvcc -gencode=arch=compute_90a,code=sm_90a /tmp/gemm_build/*.o -o /tmp/gemm_build/gemm_bench || { cat "$OUT"/build_*.log; exit 1; }
grep -h -E "registers|spill|C75" "$OUT"/build_grouped_gemm_wgmma.cu.log | sort | uniq -c | head -20
echo "HGMMA in SASS: $(cuobjdump --dump-sass /tmp/gemm_build/gemm_bench | grep -c HGMMA)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PYTHONUNBUFFERED=1 python3 bench/standalone/gemm_torch.py "${1:-20}" 2>&1 | tee "$OUT/torch.log"
/tmp/gemm_build/gemm_bench "${1:-20}" 2>&1 | tee "$OUT/bench.log"
if [ "${2:-}" = ncu ]; then  # profile one dW (wgmma f32, mma f32, wgmma bf16) and one wgmma fwd
  ncu --clock-control none -k regex:gmm_ --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats /tmp/gemm_build/gemm_bench 1 prof > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_]*gmm|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Hit|L2 Hit|Warp Cycles Per Issued|Issued Warp|One or More" "$OUT/ncu.txt" | head -60
fi
