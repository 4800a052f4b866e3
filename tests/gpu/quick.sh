#!/usr/bin/env bash
# quick.sh (on the GPU machine, from the repo root): a short check after a CUDA change, from the
# stage_session.sh bundle (GPU_BIN, default gpu-bin-lead): test_backend without the CPU-heavy
# real-shape GEMM case (BACKEND_FILTER narrows it), kernel microbenchmarks (BENCH_KERNEL_ARGS), the
# seq-4096 proxy once per QUICK_RUNS entry (';'-separated; in an entry, VAR=value words are
# environment, dotted key=value words are --set overrides, the word `default` keeps the default
# precision instead of all-bf16; e.g. "MT_FUSED_ADAMW=0 optimizer.clip_grad=0; default"), then
# Backend.GroupedMatmul with what is left of BUDGET_S. Logs in $OUT; a summary last.
set -uo pipefail
root=$(pwd); out=${OUT:-/tmp/quick-out}; mkdir -p "$out"
t0=$(date +%s); budget=${BUDGET_S:-540}
bin=$(mktemp -d); tar -xJf "${GPU_BIN:-gpu-bin-lead}/bundle.tar.xz" -C "$bin"
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/summary.txt"
timeout 200 "$bin/test_backend" --gtest_color=no --gtest_filter="${BACKEND_FILTER:--Backend.GroupedMatmul}" > "$out/backend.log" 2>&1
echo "test_backend (-GroupedMatmul): exit $? $(grep -E '^\[ +(PASSED|FAILED)' "$out/backend.log" | head -3 | tr '\n' ' ')" | tee -a "$out/summary.txt"
if [[ -n "${BENCH_KERNEL_ARGS:-}" ]]; then
  # shellcheck disable=SC2086
  timeout 150 "$bin/moetrain" bench --kernels --no-steps --seq 4096 $BENCH_KERNEL_ARGS > "$out/kernels.log" 2>&1
  echo "kernels: exit $?" >> "$out/summary.txt"
fi
bf16="--set optimizer.main_grads_dtype=bf16 --set optimizer.main_params_dtype=bf16 --set optimizer.exp_avg_dtype=bf16 --set optimizer.exp_avg_sq_dtype=bf16"
i=0
IFS=';' read -ra runs <<< "${QUICK_RUNS:-${QUICK_ENV:-NONE=1}}"
for run in "${runs[@]}"; do
  i=$((i + 1))
  envs=(NONE=1) sets=() prec=$bf16
  for w in $run; do
    case "$w" in
      default) prec="" ;;
      *.*=*) sets+=(--set "$w") ;;
      *=*) envs+=("$w") ;;
    esac
  done
  # shellcheck disable=SC2086
  env "${envs[@]}" timeout 150 "$bin/moetrain" bench --layers 2,4 --seq 4096 --mbs 1 --profile $prec "${sets[@]}" > "$out/bench$i.log" 2>&1
  echo "bench [$run]: exit $? | $(grep -iE 'per layer' "$out/bench$i.log" | head -2 | tr -s ' ' | tr '\n' ' ')" >> "$out/summary.txt"
done
left=$(( budget - ($(date +%s) - t0) ))
if (( left > 40 )); then
  timeout $(( left - 10 )) "$bin/test_backend" --gtest_color=no --gtest_filter=Backend.GroupedMatmul > "$out/gmm.log" 2>&1
  echo "Backend.GroupedMatmul: exit $? $(grep -cE 'FAIL' "$out/gmm.log") FAIL lines, $(grep -E '^\[ +(PASSED|FAILED)' "$out/gmm.log" | head -2 | tr '\n' ' ')" >> "$out/summary.txt"
fi
echo; cat "$out/summary.txt"; [[ -f "$out/kernels.log" ]] && grep -E "loss_head|loss head|gmm|grouped" "$out/kernels.log" | head -30
