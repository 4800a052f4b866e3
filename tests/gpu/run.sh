#!/usr/bin/env bash
# run.sh (on the GPU machine, from the repo root): runs gpu-bin/test_backend (staged by
# prepare.sh) with the bundled libraries, writes logs to $OUT, and prints a short per-op table
# last (max normalized error, comparisons, failures), then the whole-model results of
# test_model_gpu.cpp (fixtures in bf16/f32, recompute policies, the Qwen3-30B-A3B-width proxy).
# Extra arguments go to the test binary, e.g. --gtest_filter=Backend.Attention. Exit status is
# the test binary's.
# PARALLEL=1 (no extra arguments): the whole suite in about a quarter of the time (133 s on the H200, where
# one test after the other took about 470). The GEMM tuner's test runs
# alone first (it times cuBLASLt offers, and fails when none wins), then nine processes share the GPU:
# the grouped GEMM's small cases, its two model-width cases (mostly CPU reference work), the fused update
# at the model's widths, the rest, and the ws-vs-wgmma bits tests once more under each dW knob that a
# process reads once (MT_DW_TALL=1, MT_DW_DEEP=1, MT_DW_TMA=1 and MT_DW_TMA=0; about 20 s each).
# Exit status: the first non-zero one.
set -uo pipefail
if [[ "${PARALLEL:-0}" == 1 && $# -gt 0 ]]; then
  echo "run.sh: PARALLEL=1 runs the whole suite in its own groups; it takes no test arguments (got: $*)" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${GPU_BIN:-$root/gpu-bin}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
out=${OUT:-/tmp/moetrain-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
ldd "$bin/test_backend" > "$out/ldd.txt" 2>&1
if grep -q "not found" "$out/ldd.txt"; then echo "unresolved libraries:"; grep "not found" "$out/ldd.txt"; fi
cd "$root"
start=$(date +%s)
if [[ "${PARALLEL:-0}" == 1 ]]; then
  tuned=Backend.MatmulTunedKeepsTheDefaultsBits gmm=Backend.GroupedMatmul
  gmm_gu=Backend.GroupedMatmulModelWidthsGateUp gmm_dn=Backend.GroupedMatmulModelWidthsDown
  widths=Backend.GroupedMatmulBackwardAdamWModelWidths
  timeout "${TIMEOUT:-330}" "$bin/test_backend" --gtest_color=no --gtest_filter=$tuned > "$out/test_backend.0.log" 2>&1
  rc=$?
  pids=()
  i=1
  # "ENV=V filter": the filter's tests in a process of their own, under the environment before it (if any)
  for job in "$gmm" "$gmm_gu" "$gmm_dn" "$widths" "-$tuned:$gmm:$gmm_gu:$gmm_dn:$widths" \
             "MT_DW_TALL=1 Backend.GroupedGemmWs*" "MT_DW_DEEP=1 Backend.GroupedGemmWs*" \
             "MT_DW_TMA=1 Backend.GroupedGemmWs*" "MT_DW_TMA=0 Backend.GroupedGemmWs*"; do
    envs=()
    [[ "$job" == *" "* ]] && envs=("${job%% *}")
    f=${job##* }
    env "${envs[@]}" timeout "${TIMEOUT:-330}" "$bin/test_backend" --gtest_color=no --gtest_filter="$f" \
      > "$out/test_backend.$i.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  for pid in "${pids[@]}"; do
    wait "$pid"
    r=$?
    [[ $rc -ne 0 ]] || rc=$r
  done
  for k in $(seq 0 $((i - 1))); do cat "$out/test_backend.$k.log"; done > "$out/test_backend.log"
else
  timeout "${TIMEOUT:-330}" "$bin/test_backend" --gtest_color=no "$@" > "$out/test_backend.log" 2>&1
  rc=$?
fi
echo "test_backend exit $rc after $(( $(date +%s) - start )) s; log: $out/test_backend.log"
grep -E "^\[ +(FAILED|PASSED|SKIPPED) +\]|^\[ +OK +\]" "$out/test_backend.log" | tail -25
grep -B2 -A6 "Failure" "$out/test_backend.log" | head -60
# Per-op summary of the comparison table printed by the binary (rows: op output dtype shape err tol ok).
awk '/^op +output +dtype/ {on = 1; next}
     on && /^backend table:/ {summary = summary (summary == "" ? "" : "\n") $0; on = 0; next}
     on && NF >= 6 {op = $1; err = $(NF - 2); st = $NF; n[op]++; if (st == "FAIL") f[op]++;
                    if (!(op in mx) || err + 0 > mx[op] + 0) mx[op] = err}
     END {printf "\n%-24s %6s %6s %10s\n", "op", "cmp", "fail", "max.err";
          for (o in n) printf "%-24s %6d %6d %10s\n", o, n[o], f[o] + 0, mx[o];
          print summary}' "$out/test_backend.log" | tee "$out/summary.txt"
# Whole model: worst gradient per fixture/dtype, the loss rows, recompute and proxy lines.
awk '/^op +output +dtype/ {on = 1; next}
     on && $1 ~ /^(model|recompute)\./ {k = $1; err = $(NF - 2); st = $NF
       if ($2 ~ /^grad\./) { if (!(k in g)) ng++; if (!(k in g) || err + 0 > g[k] + 0) { g[k] = err; gn[k] = $2 } }
       else rows[++n] = sprintf("%-30s %-28s %10s %s", $1, $2, err, st)
       if (st == "FAIL") bad[k]++}
     END {if (n + ng == 0) exit
          printf "\nmodel on the GPU (normalized or relative error vs transformers / the kNone run)\n"
          for (i = 1; i <= n; ++i) print rows[i]
          for (k in g) printf "%-30s %-28s %10s (worst gradient: %s)\n", k, "grads(max)", g[k], gn[k]
          for (k in bad) printf "%-30s %d FAILED\n", k, bad[k]}' "$out/test_backend.log" | tee "$out/model_gpu.txt"
grep -E "^(proxy|recompute) " "$out/test_backend.log" | tee -a "$out/model_gpu.txt"
exit $rc
