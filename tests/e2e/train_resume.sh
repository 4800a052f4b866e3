#!/usr/bin/env bash
# End-to-end trainer checks with the moetrain binary ($1) on a tiny random MoE and mock data:
#  1. SIGKILL in the middle of a checkpoint save leaves the previous checkpoint as `latest`; the
#     next run resumes from it and ends with the same loss as an uninterrupted run (bit-identical).
#  2. SIGTERM: the trainer saves at the end of the current step and exits with status 0.
#  3. A corrupt checkpoint is detected and the damaged file named; a mistyped key gets a suggestion.
set -euo pipefail
MT=$(realpath "${1:?usage: train_resume.sh MOETRAIN_BINARY}")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cat > "$W/cfg.yaml" <<'YAML'
model: {preset: tiny-moe}
data: {mock_data: true}
training: {objective: pretrain, seq_length: 32, micro_batch_size: 1, global_batch_size: 2, train_iters: 8,
           eval_interval: 4, eval_iters: 1, device: cpu}
optimizer: {lr: 3.0e-3, lr_warmup_iters: 2}
checkpoint: {save_interval: 2, keep_last: 2}
logging: {tensorboard: false}
YAML
last_loss() { grep '"type":"train"' "$1/metrics.jsonl" | tail -n 1 | sed 's/.*"loss":\([^,]*\).*/\1/'; }

# Reference: 8 steps straight.
"$MT" train "$W/cfg.yaml" logging.run_dir="$W/straight" checkpoint.export_hf=false > "$W/straight.log" 2>&1 \
  || { cat "$W/straight.log"; fail "straight run"; }

# 1. Kill -9 while step 4's checkpoint sits complete but not yet renamed (step 2 saved by a run
#    that stopped there through exit_interval, so that only step 4's save pauses).
R=$W/killed
"$MT" train "$W/cfg.yaml" logging.run_dir="$R" training.exit_interval=2 > "$W/first.log" 2>&1 || { cat "$W/first.log"; fail "first run"; }
MT_TEST_SAVE_PAUSE_MS=60000 "$MT" train "$W/cfg.yaml" logging.run_dir="$R" > "$W/killed.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  ls -d "$R"/checkpoints/.tmp-step_4-*/manifest.json > /dev/null 2>&1 && break
  sleep 0.1
done
ls -d "$R"/checkpoints/.tmp-step_4-*/manifest.json > /dev/null 2>&1 || { kill -9 $pid; cat "$W/killed.log"; fail "save of step 4 never started"; }
kill -9 $pid
wait $pid 2>/dev/null || true
[[ "$(cat "$R/checkpoints/latest")" == "step_2" ]] || fail "latest is '$(cat "$R/checkpoints/latest")', expected step_2"
[[ ! -e "$R/checkpoints/step_4" ]] || fail "step_4 appeared although its save was killed"
"$MT" train "$W/cfg.yaml" logging.run_dir="$R" > "$W/resumed.log" 2>&1 || { cat "$W/resumed.log"; fail "resumed run"; }
grep -q "resuming from .*step_2" "$W/resumed.log" || fail "the resumed run did not start from step_2"
[[ "$(last_loss "$R")" == "$(last_loss "$W/straight")" ]] || fail "final loss $(last_loss "$R") != straight $(last_loss "$W/straight")"
[[ $(grep -c '"type":"train"' "$R/metrics.jsonl") -eq 8 ]] || fail "metrics.jsonl should hold 8 train lines"
[[ -f "$R/hf/config.json" && -f "$R/training.svg" && -f "$R/resolved_config.yaml" ]] || fail "run directory incomplete"
ls -d "$R"/checkpoints/.tmp-* > /dev/null 2>&1 && fail "temporary checkpoint directory left behind"

# 2. SIGTERM: save and exit cleanly.
T=$W/term
"$MT" train "$W/cfg.yaml" logging.run_dir="$T" training.train_iters=100000 checkpoint.save_interval=0 > "$W/term.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [[ -s "$T/metrics.jsonl" ]] && break
  sleep 0.1
done
kill -TERM $pid
rc=0; wait $pid || rc=$?
[[ $rc -eq 0 ]] || { cat "$W/term.log"; fail "SIGTERM exit status $rc"; }
step=$(cat "$T/checkpoints/latest")
[[ "$step" =~ ^step_[0-9]+$ ]] || fail "no checkpoint after SIGTERM"
"$MT" train "$W/cfg.yaml" logging.run_dir="$T" training.train_iters=100000 --print-config > /dev/null

# 3. Corruption and config errors.
f=$(ls "$R"/checkpoints/step_8/model/*.safetensors | head -n 1)
printf '\x01' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 5 )) conv=notrunc status=none
if "$MT" train "$W/cfg.yaml" logging.run_dir="$R" training.train_iters=9 > "$W/corrupt.log" 2>&1; then fail "corrupt checkpoint accepted"; fi
grep -q "step_8 is corrupt: model/$(basename "$f") has CRC32" "$W/corrupt.log" || { cat "$W/corrupt.log"; fail "corruption not named"; }
if "$MT" train "$W/cfg.yaml" optimizer.lerning_rate=1 > "$W/key.log" 2>&1; then fail "unknown key accepted"; fi
grep -q "unknown key 'optimizer.lerning_rate'" "$W/key.log" || { cat "$W/key.log"; fail "unknown key message"; }
echo "train_resume: ok"
