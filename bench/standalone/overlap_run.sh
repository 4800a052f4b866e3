#!/usr/bin/env bash
# Device-machine driver for bench/standalone/overlap.cu (AdamW beside the expert GEMMs on two
# streams): builds it with the warp-specialized GEMM (src/kernels/cuda/grouped_gemm_ws.cu, stub
# headers of gemm_stub/) and runs it. Usage (repo root, GPU machine): bash bench/standalone/overlap_run.sh [reps]
set -o pipefail
OUT=${OUT:-/tmp/overlap_out}
B=/tmp/overlap_build
mkdir -p "$OUT" $B
export PATH=/usr/local/cuda/bin:$PATH
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
nvcc $FLAGS -Xptxas -v -c bench/standalone/overlap.cu -o $B/overlap.o > "$OUT/build_overlap.log" 2>&1 &
nvcc $FLAGS -c src/kernels/cuda/grouped_gemm_ws.cu -o $B/ws.o > "$OUT/build_ws.log" 2>&1 &
wait
nvcc -gencode=arch=compute_90a,code=sm_90a $B/overlap.o $B/ws.o -o $B/overlap \
  || { tail -n 30 "$OUT"/build_*.log; exit 1; }
grep -A1 "adamw_whole_sm" "$OUT/build_overlap.log" | grep -E "registers|spill" | head -3
timeout 200 $B/overlap "${1:-7}" 2>&1 | tee "$OUT/overlap.log" | tail -n 16
