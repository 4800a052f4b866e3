#!/usr/bin/env bash
# Device-machine A/B of the warp-specialized grouped GEMM: builds bench/standalone/gemm_ws.cu twice,
# against src/kernels/cuda/grouped_gemm_ws.cu (new) and against .wsold/grouped_gemm_ws.cu (old: a
# copy of an earlier version, e.g. `git show HEAD:src/kernels/cuda/grouped_gemm_ws.cu`), checks the
# new one on the edge cases, then times both on the model shapes in ROUNDS alternating runs (new
# first), with torch._grouped_mm once in the same call. Logs in $OUT.
# Usage (repo root, GPU machine): bash bench/standalone/gemm_ws_ab.sh [reps] [rounds]
set -o pipefail
OUT=${OUT:-/tmp/gemm_ws_ab}
B=/tmp/gemm_ws_ab_build
mkdir -p "$OUT" $B/new $B/old
export PATH=/usr/local/cuda/bin:$PATH
REPS=${1:-20}
ROUNDS=${2:-2}
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ibench/standalone/gemm_stub -Isrc"
[ -f .wsold/grouped_gemm_ws.cu ] || { echo "no .wsold/grouped_gemm_ws.cu"; exit 2; }
nvcc $FLAGS -c bench/standalone/gemm_ws.cu -o $B/h.o > "$OUT/build_h.log" 2>&1 &
nvcc $FLAGS -c src/kernels/cuda/grouped_gemm_wgmma.cu -o $B/wgmma.o > "$OUT/build_wgmma.log" 2>&1 &
nvcc $FLAGS -Xptxas -v -c src/kernels/cuda/grouped_gemm_ws.cu -o $B/new/ws.o > "$OUT/build_new.log" 2>&1 &
nvcc $FLAGS -Xptxas -v -c .wsold/grouped_gemm_ws.cu -o $B/old/ws.o > "$OUT/build_old.log" 2>&1 &
wait
for v in new old; do
  nvcc -gencode=arch=compute_90a,code=sm_90a $B/h.o $B/wgmma.o $B/$v/ws.o -o $B/$v/gemm_ws || { tail -n 30 "$OUT"/build_*.log; exit 1; }
  echo "$v: $(grep -c 'spill stores' "$OUT/build_$v.log") kernels, $(grep -E 'spill stores' "$OUT/build_$v.log" | grep -vc ' 0 bytes spill stores') with spills"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
timeout 60 $B/new/gemm_ws "$REPS" edges > "$OUT/edges_new.log" 2>&1
echo "edges (new) rc $? $(tail -n 1 "$OUT/edges_new.log")"
PYTHONUNBUFFERED=1 timeout 120 python3 bench/standalone/gemm_torch.py "$REPS" > "$OUT/torch.log" 2>&1
grep -E "^\| .*\| (fwd|dx) " "$OUT/torch.log"
for r in $(seq "$ROUNDS"); do
  for v in new old; do
    timeout 200 $B/$v/gemm_ws "$REPS" shapes > "$OUT/shapes_${v}_$r.log" 2>&1
    echo "== $v round $r rc $? $(tail -n 1 "$OUT/shapes_${v}_$r.log")"
    grep -E "^\| .*\| (ws-coop|ws-coop-c2) " "$OUT/shapes_${v}_$r.log"
  done
done
