#!/usr/bin/env bash
# session.sh (on the GPU machine, from the repo root): one run that takes every GPU measurement of
# the open issues. Needs the bundle staged by tests/gpu/stage_session.sh (GPU_BIN, default
# gpu-bin-gs/: moetrain, test_backend, lib/, tok/, data/, torch_anchor.py; or bundle.tar.xz).
# Stages: a) test_backend (GroupedMatmul's CPU-heavy real-shape case filtered out), b) the demo SFT
# on the GPU (checkpoint at 100, resume, export at 200) and on this machine's CPU, c) TensorBoard
# events read back, d) HF round trip, e) Qwen3-30B-A3B 2/4-layer proxies + torch_anchor, f)
# plan_check.sh when present. Logs and results go to $OUT/session.tar.gz (the tool returns at most 8
# files), $OUT/table.txt holds the compact table that is also printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
budget=${BUDGET_S:-520}  # optional stages are skipped once this many seconds have gone
out=${OUT:-/tmp/moetrain-gpu-out}
mkdir -p "$out"
bin=${GPU_BIN:-$root/gpu-bin-gs}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p /tmp/gs-bundle && tar -xJf "$bin/bundle.tar.xz" -C /tmp/gs-bundle && bin=/tmp/gs-bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
mt="$bin/moetrain"
runs=/tmp/gs-runs
rm -rf "$runs"; mkdir -p "$runs" data/examples
cp "$bin/data/dict_sft.jsonl" data/examples/
declare -a table
row() { table+=("$(printf '%-34s %s' "$1" "$2")"); echo "== $1: $2"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
row gpu "$(head -1 "$out/gpu.txt")"
ncpu=$(nproc)

# b, CPU half: the same demo run on the CPU, in the background while the GPU works.
demo=(examples/demo.yaml model.tokenizer="$bin/tok" training.seq_length=128 training.train_iters=200
      training.eval_interval=50 checkpoint.save_interval=100 logging.log_interval=20)
( MT_NUM_THREADS=$(( ncpu > 4 ? ncpu - 3 : 1 )) timeout 420 "$mt" train "${demo[@]}" training.device=cpu \
    checkpoint.export_hf=false logging.run_dir="$runs/demo_cpu" > "$out/demo_cpu.log" 2>&1
  echo "exit $?" >> "$out/demo_cpu.log" ) &
cpu_pid=$!

# a) backend comparisons on the GPU.
s=$(date +%s)
timeout 150 "$bin/test_backend" --gtest_color=no --gtest_filter=-Backend.GroupedMatmul > "$out/test_backend.log" 2>&1
rc=$?
row "a test_backend (-GroupedMatmul)" "exit $rc, $(grep -E '^\[ +PASSED' "$out/test_backend.log" | head -1 | tr -s ' ') \
$(grep -cE '^\[ +FAILED +\] Backend|^\[ +FAILED +\] Model' "$out/test_backend.log") failed, $(( $(date +%s) - s )) s; \
$(grep -E '^backend table:' "$out/test_backend.log" | head -1)"

# b) GPU demo: 100 steps, exit with a checkpoint, resume to 200, export.
s=$(date +%s)
timeout 150 "$mt" train "${demo[@]}" training.device=cuda training.exit_interval=100 \
  logging.run_dir="$runs/demo_gpu" > "$out/demo_gpu_part1.log" 2>&1
rc1=$?
timeout 150 "$mt" train "${demo[@]}" training.device=cuda logging.run_dir="$runs/demo_gpu" \
  > "$out/demo_gpu_part2.log" 2>&1
rc2=$?
cp "$runs/demo_gpu/metrics.jsonl" "$out/demo_gpu_metrics.jsonl" 2>/dev/null
cp "$runs/demo_gpu/training.svg" "$out/demo_gpu_training.svg" 2>/dev/null
mkdir -p "$out/tb_gpu" && cp -r "$runs/demo_gpu/tensorboard/." "$out/tb_gpu/" 2>/dev/null
row "b gpu demo (100 + resume 100)" "exit $rc1/$rc2, $(( $(date +%s) - s )) s; \
$(grep -hE 'resuming from|done:' "$out"/demo_gpu_part*.log | sed 's/.*\] //' | tr '\n' ';')"

# c) TensorBoard: read the GPU run's event files with the tensorboard package.
python3 tests/gpu/read_tb.py "$runs/demo_gpu/tensorboard" > "$out/tensorboard_read.txt" 2>&1
row "c tensorboard EventAccumulator" "exit $?, $(tail -1 "$out/tensorboard_read.txt")"

# d) Hugging Face round trip (transformers fp32 vs moetrain fwdbwd fp32).
timeout 150 python3 tests/reference/check_hf_roundtrip.py --moetrain "$mt" --work "$runs/roundtrip" \
  --model "$runs/demo_gpu/hf" --init tiny-moe --saved > "$out/roundtrip.log" 2>&1
row "d hf round trip" "exit $?, $(grep 'roundtrip summary' "$out/roundtrip.log")"

# b, CPU half: wait for it (its timeout bounds the wait).
wait $cpu_pid
cp "$runs/demo_cpu/metrics.jsonl" "$out/demo_cpu_metrics.jsonl" 2>/dev/null
row "b cpu demo (${ncpu} cores)" "$(tail -1 "$out/demo_cpu.log"), $(grep -h 'done:' "$out/demo_cpu.log" | sed 's/.*\] //')"
python3 tests/gpu/compare_curves.py "$out/demo_gpu_metrics.jsonl" "$out/demo_cpu_metrics.jsonl" \
  > "$out/curves.txt" 2>&1
row "b gpu vs cpu loss" "$(tail -1 "$out/curves.txt")"

# e) step time of Qwen3-30B-A3B proxies (2 and 4 layers, seq 4096, mbs 1, bf16, mock data). The
# process is killed after 6 logged steps: a final checkpoint of a 30B-width proxy would be tens of GB.
proxy() {
  local L=$1 dir="$runs/proxy$1"
  "$mt" train tests/gpu/proxy.yaml model.num_layers="$L" logging.run_dir="$dir" > "$out/proxy$L.log" 2>&1 &
  local pid=$! t0=$(date +%s)
  while kill -0 $pid 2>/dev/null; do
    n=$(grep -c '"type":"train"' "$dir/metrics.jsonl" 2>/dev/null)
    [[ ${n:-0} -ge 6 || $(( $(date +%s) - t0 )) -gt 110 ]] && { kill -9 $pid; break; }
    sleep 1
  done
  wait $pid 2>/dev/null
  cp "$dir/metrics.jsonl" "$out/proxy${L}_metrics.jsonl" 2>/dev/null
}
if (( $(elapsed) < budget - 120 )); then
  proxy 2; proxy 4
  python3 tests/gpu/proxy_table.py "$out/proxy2_metrics.jsonl" "$out/proxy4_metrics.jsonl" > "$out/proxy.txt" 2>&1
  row "e proxies 30B-A3B seq 4096" "$(tail -1 "$out/proxy.txt")"
else
  row "e proxies" "skipped at $(elapsed) s"
fi

# f) the planner's check, when its script is present.
if [[ -f tests/gpu/plan_check.sh ]] && (( $(elapsed) < budget - 60 )); then
  OUT=/tmp/gs-plan timeout $(( budget - $(elapsed) > 150 ? 150 : budget - $(elapsed) )) \
    bash tests/gpu/plan_check.sh "$mt" > "$out/plan_check.log" 2>&1
  row "f plan_check.sh" "exit $?, $(tail -1 "$out/plan_check.log")"
  cp /tmp/gs-plan/plan_check.md "$out/" 2>/dev/null
else
  row "f plan_check.sh" "not run (absent or no time, $(elapsed) s)"
fi

# e) torch anchor, last, in whatever time is left.
left=$(( budget - $(elapsed) ))
if [[ -f "$bin/torch_anchor.py" ]] && (( left > 60 )); then
  IMPLS=grouped_mm SEQ=4096 OUT="$out" timeout $left python3 "$bin/torch_anchor.py" > "$out/torch_anchor.log" 2>&1
  row "e torch_anchor grouped_mm" "exit $?, $(grep -E 'ms/step|failed' "$out/torch_anchor.log" | tr '\n' ';')"
else
  row "e torch_anchor" "skipped ($left s left)"
fi

echo
echo "=============== session table ($(elapsed) s) ==============="
printf '%s\n' "${table[@]}" | tee "$out/table.txt"
echo "--- details ---"
grep -E '^\[ +FAILED' "$out/test_backend.log" | head -10
grep -E '^roundtrip|^note' "$out/roundtrip.log"
cat "$out/proxy.txt" 2>/dev/null | tail -6
cat "$out/curves.txt" | tail -4
# The tool returns at most 8 files from $OUT: pack everything but the table into one archive.
python3 tests/gpu/compare_curves.py "$out/demo_gpu_metrics.jsonl" "$out/demo_cpu_metrics.jsonl" \
  "$out/demo_loss_gpu_vs_cpu.svg" > /dev/null 2>&1
(cd "$out" && tar -czf /tmp/gs-session.tar.gz --exclude=table.txt . && find . -mindepth 1 ! -name table.txt -delete \
  && mv /tmp/gs-session.tar.gz session.tar.gz)
