#!/usr/bin/env bash
# Device-machine driver for bench/standalone/gemm_ws_dw_adamw.cu: builds the harness (the fused dW +
# AdamW kernel of src/kernels/cuda/grouped_gemm_ws_dw_adamw.cuh next to the unfused dispatch_dw +
# adamw_kernel), reports registers / spills and local-memory use in the SASS, checks bit equality on
# edge and model shapes, then times fused vs unfused. Logs go to $OUT.
# Usage (repo root, GPU machine): bash bench/standalone/gemm_ws_dw_adamw_run.sh [reps]
set -o pipefail
OUT=${OUT:-/tmp/gemm_ws_dw_adamw_out}
B=/tmp/gemm_ws_dw_adamw_build
mkdir -p "$OUT" $B
export PATH=/usr/local/cuda/bin:$PATH
REPS=${1:-20}
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
nvcc $FLAGS -Xptxas -v bench/standalone/gemm_ws_dw_adamw.cu -o $B/gemm_ws_dw_adamw > "$OUT/build.log" 2>&1 \
  || { tail -n 30 "$OUT/build.log"; exit 1; }
awk '/Compiling entry/{match($0,/_Z[^'"'"']*/); n=substr($0,RSTART,RLENGTH)} /spill stores/{print n, $0}' "$OUT/build.log" \
  | grep gmm_ws | c++filt | sed -E 's/\(CUtensorMap_st.*::/ ::/' | cut -c1-200
cuobjdump -sass $B/gemm_ws_dw_adamw > $B/sass.txt 2>/dev/null && \
  awk '/Function :/{f=$3} /STL|LDL/{c[f]++} END{for (k in c) print "local-memory instrs:", c[k], k}' $B/sass.txt | c++filt | cut -c1-160
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 60 $B/gemm_ws_dw_adamw "$REPS" edges > "$OUT/edges.log" 2>&1
echo "edges rc $?"
timeout 150 $B/gemm_ws_dw_adamw "$REPS" shapes > "$OUT/shapes.log" 2>&1
echo "shapes rc $?"
grep -h -E "FAIL|rror" "$OUT/edges.log" "$OUT/shapes.log" | head -20
grep -c PASS "$OUT/edges.log"
tail -n 1 "$OUT/edges.log"
grep -E "PASS|FAIL" "$OUT/shapes.log"
sed -n '/^| shape/,$p' "$OUT/shapes.log"
