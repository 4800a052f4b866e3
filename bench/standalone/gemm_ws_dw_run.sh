#!/usr/bin/env bash
# Device-machine driver for bench/standalone/gemm_ws_dw.cu: builds the harness (with the TMA dW
# kernel, src/kernels/cuda/grouped_gemm_ws_dw.cuh) and the cp.async wgmma kernel (src/), reports
# registers / spills, times torch._grouped_mm, then checks and times ours. Logs go to $OUT.
# Usage (repo root, GPU machine): bash bench/standalone/gemm_ws_dw_run.sh [reps]
set -o pipefail
OUT=${OUT:-/tmp/gemm_ws_dw_out}
B=/tmp/gemm_ws_dw_build
mkdir -p "$OUT" $B
export PATH=/usr/local/cuda/bin:$PATH
REPS=${1:-20}
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
for f in bench/standalone/gemm_ws_dw.cu src/kernels/cuda/grouped_gemm_wgmma.cu; do
  nvcc $FLAGS -Xptxas -v -c "$f" -o "$B/$(basename "$f").o" > "$OUT/build_$(basename "$f").log" 2>&1 &
done
wait
nvcc -gencode=arch=compute_90a,code=sm_90a $B/gemm_ws_dw.cu.o $B/grouped_gemm_wgmma.cu.o -o $B/gemm_ws_dw \
  || { cat "$OUT"/build_*.log; exit 1; }
grep -h -E "gmm_ws_dw|registers|spill|warn|C75" "$OUT"/build_gemm_ws_dw.cu.log | grep -v "0 bytes spill" | head -30
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PYTHONUNBUFFERED=1 timeout 60 python3 bench/standalone/gemm_torch.py "$REPS" > "$OUT/torch.log" 2>&1
echo "torch rc $?"
timeout 30 $B/gemm_ws_dw "$REPS" edges > "$OUT/edges.log" 2>&1
echo "edges rc $?"
timeout 100 $B/gemm_ws_dw "$REPS" shapes > "$OUT/shapes.log" 2>&1
echo "shapes rc $?"
grep -h -E "FAIL|error|rror" "$OUT/edges.log" "$OUT/shapes.log" | head -30
tail -n 1 "$OUT/edges.log"
grep -E "^\|.*dw" "$OUT/torch.log"
grep -E "^\||PASS|check\(s\)" "$OUT/shapes.log" | grep -v "PASS$" 
