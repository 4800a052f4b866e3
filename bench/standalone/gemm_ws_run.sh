#!/usr/bin/env bash
# Device-machine driver for bench/standalone/gemm_ws.cu: builds the harness, the warp-specialized
# kernel (src/kernels/cuda/grouped_gemm_ws.cu) and the cp.async wgmma kernel in parallel, reports
# registers / spills and the HGMMA / TMA instructions in the SASS, times torch._grouped_mm, then
# checks and times ours (model shapes first, edge cases in a second process under a time limit).
# Usage (repo root, GPU machine): bash bench/standalone/gemm_ws_run.sh [reps] [ncu]. Logs go to $OUT.
# The wgmma kernel is taken from .wsref/ when that folder exists (a snapshot of the committed file,
# carried when the working copy is mid-change), else from src/.
set -o pipefail
OUT=${OUT:-/tmp/gemm_ws_out}
B=/tmp/gemm_ws_build
mkdir -p "$OUT" $B
export PATH=/usr/local/cuda/bin:$PATH
REPS=${1:-20}
OLD=src/kernels/cuda/grouped_gemm_wgmma.cu
INC="-Ibench/standalone/gemm_stub -Isrc"
if [ -f .wsref/kernels/cuda/grouped_gemm_wgmma.cu ]; then OLD=.wsref/kernels/cuda/grouped_gemm_wgmma.cu; INC="-I.wsref $INC"; fi
FLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo $INC"
for f in bench/standalone/gemm_ws.cu src/kernels/cuda/grouped_gemm_ws.cu $OLD; do
  nvcc $FLAGS -Xptxas -v -c "$f" -o "$B/$(basename "$f").o" > "$OUT/build_$(basename "$f").log" 2>&1 &
done
wait
nvcc -gencode=arch=compute_90a,code=sm_90a $B/gemm_ws.cu.o $B/grouped_gemm_ws.cu.o $B/grouped_gemm_wgmma.cu.o \
  -o $B/gemm_ws || { cat "$OUT"/build_*.log; exit 1; }
grep -h -E "registers|spill|warn|C75" "$OUT"/build_grouped_gemm_ws.cu.log | sort | uniq -c | head -20
cuobjdump --dump-sass $B/grouped_gemm_ws.cu.o > $B/sass.txt
echo "SASS ws: HGMMA $(grep -c HGMMA $B/sass.txt), UTMALDG $(grep -c UTMALDG $B/sass.txt), UTMAPF $(grep -c UTMAPF $B/sass.txt), USETMAXREG $(grep -c USETMAXREG $B/sass.txt), LDL/STL $(grep -c -E 'LDL|STL' $B/sass.txt)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
PYTHONUNBUFFERED=1 timeout 120 python3 bench/standalone/gemm_torch.py "$REPS" > "$OUT/torch.log" 2>&1
echo "torch rc $?"
timeout 280 $B/gemm_ws "$REPS" shapes > "$OUT/shapes.log" 2>&1
echo "shapes rc $?"
timeout 40 $B/gemm_ws "$REPS" edges > "$OUT/edges.log" 2>&1
echo "edges rc $?"
grep -h -E "FAIL|DIFFER|error|rror" "$OUT/shapes.log" "$OUT/edges.log" | head -30
tail -n 3 "$OUT/edges.log"
grep -E "^\|" "$OUT/torch.log"
grep -E "^\||PASS|check\(s\)" "$OUT/shapes.log"
if [ "${2:-}" = ncu ]; then  # speed-of-light of one gate_up fwd and dx per kernel (wgmma, ws 1..4)
  timeout 90 ncu --clock-control none -k regex:gmm_ --section SpeedOfLight $B/gemm_ws 1 prof > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-zA-Z_:<>]*gmm|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)" "$OUT/ncu.txt" | sed -E 's/\(Context.*//' | head -60
fi
