#!/usr/bin/env bash
# bench.sh (on the GPU machine, from the repo root): runs gpu-bin/kernel_bench (staged by
# prepare.sh) and bench/torch_kernels.py on the same shapes in one call, logs to $OUT, and prints
# a table last: case, moetrain ms, torch ms, torch/moetrain (> 1 means moetrain is faster).
# Extra arguments go to both programs (e.g. --reps 10 --seqs 4096).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${GPU_BIN:-$root/gpu-bin}
out=${OUT:-/tmp/moetrain-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
cd "$root"
timeout "${TIMEOUT:-240}" "$bin/kernel_bench" "$@" > "$out/kernel_bench.log" 2>&1; rc1=$?
timeout "${TIMEOUT:-240}" python3 bench/torch_kernels.py "$@" > "$out/torch_kernels.log" 2>&1; rc2=$?
echo "kernel_bench exit $rc1, torch_kernels exit $rc2 ($(date -u +%F), $(head -1 "$out/torch_kernels.log"))"
grep -v "^torch\|ms " "$out/kernel_bench.log" | tail -5
grep "^torch .*: " "$out/torch_kernels.log" | tail -5
# Join on the case name minus its trailing variant tag (dw(f32+=) vs dw(bf16), bwd vs bwd(autograd)).
awk '
  function key(s) { sub(/\(.*\)$/, "", s); return s }
  FNR == NR { if ($0 ~ / ms /) { n = $0; sub(/ +[0-9.]+ ms.*/, "", n); split($0, f, " ms"); m = f[1]; sub(/.* /, "", m);
              k = key(n); ours[k] = m; name[k] = n; order[++cnt] = k } next }
  /^torch / && / ms / { n = $0; sub(/^torch /, "", n); sub(/ +[0-9.]+ ms.*/, "", n); split($0, f, " ms"); m = f[1];
                        sub(/.* /, "", m); theirs[key(n)] = m }
  END { printf "%-36s %10s %10s %8s\n", "case", "ours ms", "torch ms", "ratio";
        for (i = 1; i <= cnt; ++i) { k = order[i]; t = (k in theirs) ? theirs[k] : "-";
          r = (k in theirs && ours[k] > 0) ? sprintf("%.2f", theirs[k] / ours[k]) : "-";
          printf "%-36s %10s %10s %8s\n", name[k], ours[k], t, r } }' "$out/kernel_bench.log" "$out/torch_kernels.log" | tee "$out/bench_table.txt"
