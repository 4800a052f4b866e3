#!/usr/bin/env bash
# Device-machine driver for bench/standalone/store_bw.cu: builds it and prints its table for the gate_up
# gradient (128 x 1536 x 2048 bf16) and the down one (128 x 2048 x 768), each run twice.
# Usage (repo root, GPU machine): bash bench/standalone/store_bw_run.sh. Logs go to $OUT.
set -euo pipefail
OUT=${OUT:-/tmp/store_bw_out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
nvcc -O3 -std=c++17 -arch=sm_90a -Isrc bench/standalone/store_bw.cu -o "$OUT/store_bw"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader
for shape in "128 1536 2048" "128 2048 768"; do
  for run in 1 2; do
    # shellcheck disable=SC2086
    timeout 120 "$OUT/store_bw" $shape | tee "$OUT/store_bw_${shape// /_}_$run.txt"
  done
done
