#!/usr/bin/env bash
# Device-machine driver for bench/standalone/gemm_ws_dw.cu: builds the harness (with the TMA dW
# kernel, src/kernels/cuda/grouped_gemm_ws_dw.cuh) and the cp.async wgmma kernel (src/), reports
# registers / spills, times torch._grouped_mm, then checks and times ours. A snapshot of an earlier
# grouped_gemm_ws_dw.cuh (and, since round 50, grouped_gemm_ws_dw_stage.cuh) in $DW_OLD (default
# build-dw/dw_old, e.g. carried) is built in as gwd_old for an A/B in the same process. PREBUILT=1
# reuses the binary in $B. Logs go to $OUT.
# Usage (repo root, GPU machine): bash bench/standalone/gemm_ws_dw_run.sh [reps]
set -o pipefail
OUT=${OUT:-/tmp/gemm_ws_dw_out}
B=${B:-/tmp/gemm_ws_dw_build}
mkdir -p "$OUT" "$B"
export PATH=/usr/local/cuda/bin:$PATH
REPS=${1:-20}
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
OLD=${DW_OLD:-build-dw/dw_old}
if [ -f "$OLD/grouped_gemm_ws_dw.cuh" ]; then
  mkdir -p "$B/old/kernels/cuda"
  for f in grouped_gemm_ws_dw grouped_gemm_ws_dw_stage; do
    [ -f "$OLD/$f.cuh" ] || continue  # (snapshots before round 50 hold the staging in grouped_gemm_ws_dw.cuh)
    sed -e 's/namespace moetrain::cuda::gwd\b/namespace moetrain::cuda::gwd_old/' \
        -e 's|kernels/cuda/grouped_gemm_ws_dw_stage.cuh|kernels/cuda/grouped_gemm_ws_dw_stage_old.cuh|' \
        "$OLD/$f.cuh" > "$B/old/kernels/cuda/${f}_old.cuh"
  done
  FLAGS="$FLAGS -DMT_DW_OLD -I$B/old"
  echo "A/B against the snapshot in $OLD"
fi
if [ "${PREBUILT:-0}" != 1 ]; then
  for f in bench/standalone/gemm_ws_dw.cu src/kernels/cuda/grouped_gemm_wgmma.cu; do
    nvcc $FLAGS -Xptxas -v -c "$f" -o "$B/$(basename "$f").o" > "$OUT/build_$(basename "$f").log" 2>&1 &
  done
  wait
  nvcc -gencode=arch=compute_90a,code=sm_90a $B/gemm_ws_dw.cu.o $B/grouped_gemm_wgmma.cu.o -lcublasLt -lcublas -o $B/gemm_ws_dw \
    || { cat "$OUT"/build_*.log; exit 1; }
  awk '/Compiling entry/{match($0,/_Z[^'"'"']*/); n=substr($0,RSTART,RLENGTH)} /spill stores/{print n, $0}' \
    "$OUT/build_gemm_ws_dw.cu.log" | grep gmm_ws | c++filt | sed -E 's/\(CUtensorMap_st.*::/ ::/' | cut -c1-200
  grep -h -E "C75|warn" "$OUT/build_gemm_ws_dw.cu.log" | head
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
PYTHONUNBUFFERED=1 timeout 60 python3 bench/standalone/gemm_torch.py "$REPS" > "$OUT/torch.log" 2>&1
echo "torch rc $?"
timeout 30 $B/gemm_ws_dw "$REPS" edges > "$OUT/edges.log" 2>&1
echo "edges rc $?"
timeout 100 $B/gemm_ws_dw "$REPS" shapes > "$OUT/shapes.log" 2>&1
echo "shapes rc $?"
grep -h -E "FAIL|error|rror" "$OUT/edges.log" "$OUT/shapes.log" | head -30
grep -c PASS "$OUT/edges.log"
tail -n 1 "$OUT/edges.log"
grep -E "^\|.*dw" "$OUT/torch.log"
grep -E "^\||PASS|check\(s\)" "$OUT/shapes.log" | grep -v "PASS$"
