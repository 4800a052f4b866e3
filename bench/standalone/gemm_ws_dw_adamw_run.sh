#!/usr/bin/env bash
# Device-machine driver for bench/standalone/gemm_ws_dw_adamw.cu: builds the harness (the fused dW +
# AdamW kernel of src/kernels/cuda/grouped_gemm_ws_dw_adamw.cuh next to the unfused dispatch_dw +
# adamw_kernel), reports registers / spills, checks bit equality on edge and model shapes, then times
# fused vs unfused. Snapshots of earlier grouped_gemm_ws_dw{,_stage,_adamw}.cuh in $DW_OLD (default
# build-dw/dw_old) are built in as gwd_old and timed beside them. PREBUILT=1 reuses the binary in $B.
# Usage (repo root, GPU machine): bash bench/standalone/gemm_ws_dw_adamw_run.sh [reps]
set -o pipefail
OUT=${OUT:-/tmp/gemm_ws_dw_adamw_out}
B=${B:-/tmp/gemm_ws_dw_adamw_build}
mkdir -p "$OUT" "$B"
export PATH=/usr/local/cuda/bin:$PATH
REPS=${1:-20}
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
OLD=${DW_OLD:-build-dw/dw_old}
if [ -f "$OLD/grouped_gemm_ws_dw_adamw.cuh" ]; then
  mkdir -p "$B/old/kernels/cuda"
  for f in grouped_gemm_ws_dw grouped_gemm_ws_dw_stage grouped_gemm_ws_dw_adamw; do
    [ -f "$OLD/$f.cuh" ] || continue  # (snapshots before round 50 hold the staging in grouped_gemm_ws_dw.cuh)
    sed -e 's/namespace moetrain::cuda::gwd\b/namespace moetrain::cuda::gwd_old/' \
        -e 's|kernels/cuda/grouped_gemm_ws_dw.cuh|kernels/cuda/grouped_gemm_ws_dw_old.cuh|' \
        -e 's|kernels/cuda/grouped_gemm_ws_dw_stage.cuh|kernels/cuda/grouped_gemm_ws_dw_stage_old.cuh|' \
        "$OLD/$f.cuh" > "$B/old/kernels/cuda/${f}_old.cuh"
  done
  FLAGS="$FLAGS -DMT_DW_OLD -I$B/old"
  echo "A/B against the snapshot in $OLD"
fi
if [ "${PREBUILT:-0}" != 1 ]; then
  nvcc $FLAGS -Xptxas -v bench/standalone/gemm_ws_dw_adamw.cu -o $B/gemm_ws_dw_adamw > "$OUT/build.log" 2>&1 \
    || { tail -n 30 "$OUT/build.log"; exit 1; }
  awk '/Compiling entry/{match($0,/_Z[^'"'"']*/); n=substr($0,RSTART,RLENGTH)} /spill stores/{print n, $0}' \
    "$OUT/build.log" | grep gmm_ws | c++filt | sed -E 's/\(CUtensorMap_st.*::/ ::/' | cut -c1-200
  grep -h -E "C75|warn" "$OUT/build.log" | head
fi
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
