#!/usr/bin/env bash
# dpo_demo.sh (on the GPU machine, from the repo root): the two-stage demo at a size the CPU can't
# reach in minutes: SFT of demo-moe on the dictionary chats, then DPO on the dictionary preference
# pairs from the SFT export, with held-out preference accuracy and margins at every validation.
# Needs the bundle of tests/gpu/stage_session.sh (GPU_BIN, default gpu-bin-gs/) and the example
# JSONL files in gpu-dpo/ (copied there from data/examples/ by the caller; git-ignored).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-dpo-out}
mkdir -p "$out"
bin=${GPU_BIN:-$root/gpu-bin-gs}
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p /tmp/dpo-bundle && tar -xJf "$bin/bundle.tar.xz" -C /tmp/dpo-bundle && bin=/tmp/dpo-bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
mt="$bin/moetrain"
mkdir -p data/examples && cp gpu-dpo/*.jsonl data/examples/
sft_steps=${SFT_STEPS:-600}
dpo_steps=${DPO_STEPS:-200}
timeout 240 "$mt" train examples/demo.yaml model.tokenizer="$bin/tok" training.device=cuda \
  training.train_iters=$sft_steps training.seq_length=256 training.micro_batch_size=8 training.global_batch_size=32 \
  training.eval_interval=$((sft_steps / 3)) optimizer.lr_warmup_iters=20 checkpoint.save_interval=0 \
  logging.log_interval=50 logging.run_dir=runs/demo ${SFT_ARGS:-} > "$out/sft.log" 2>&1
echo "sft exit $?"
timeout 240 "$mt" train examples/demo_dpo.yaml training.device=cuda data.data_path="[data/examples/dict_pref.jsonl]" \
  data.split="95,5,0" training.train_iters=$dpo_steps training.micro_batch_size=16 training.global_batch_size=32 \
  training.eval_interval=25 training.eval_iters=10 optimizer.lr_warmup_iters=10 checkpoint.save_interval=0 \
  logging.log_interval=25 logging.run_dir=runs/demo_dpo ${DPO_ARGS:-} > "$out/dpo.log" 2>&1
echo "dpo exit $?"
cp runs/demo/metrics.jsonl "$out/sft_metrics.jsonl" 2>/dev/null
cp runs/demo_dpo/metrics.jsonl "$out/dpo_metrics.jsonl" 2>/dev/null
cp runs/demo_dpo/training.svg "$out/dpo_training.svg" 2>/dev/null
cp runs/demo/training.svg "$out/sft_training.svg" 2>/dev/null
echo "--- SFT validation"; grep -E "^validation|done:" "$out/sft.log"
echo "--- DPO validation"; grep -E "^validation|done:|error" "$out/dpo.log"
