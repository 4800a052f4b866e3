#!/usr/bin/env bash
# Device errors a user can meet: asking for a GPU where none is visible (or in a build without
# CUDA) gives one clear message and a non-zero exit, and writes no run directory contents beyond
# the resolved config. On a machine with a GPU this check is skipped (backend tests cover OOM).
set -euo pipefail
MT=$(realpath "${1:?usage: device_errors.sh MOETRAIN_BINARY}")
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "device_errors: a GPU is visible; skipped"; exit 0
fi
W=$(mktemp -d /tmp/mt_e2e_dev.XXXXXX)
trap 'rm -rf "$W"' EXIT
cat > "$W/cfg.yaml" <<YAML
model: {preset: tiny-moe}
data: {mock_data: true}
training: {objective: pretrain, seq_length: 16, train_iters: 1, device: cuda}
logging: {run_dir: $W/run}
YAML
if "$MT" train "$W/cfg.yaml" > "$W/log" 2>&1; then
  echo "FAIL: training.device=cuda succeeded without a GPU"; exit 1
fi
grep -qE "no CUDA (GPU|device) is visible|has no CUDA backend" "$W/log" || { cat "$W/log"; echo "FAIL: unclear no-GPU message"; exit 1; }
[[ ! -d "$W/run/checkpoints" ]] || { echo "FAIL: checkpoints written"; exit 1; }
echo "device_errors: ok ($(grep -oE "no CUDA (GPU|device) is visible|has no CUDA backend" "$W/log" | head -1))"
