#!/usr/bin/env bash
# End-to-end DPO with the moetrain binary ($1): a tiny random Qwen3-MoE (vocab 264) and a
# one-token-per-byte tokenizer, preference pairs in JSONL prepared on the fly by the trainer.
# Checks: the reference log-probs are computed once and reused on resume; 4 steps + resume + 4
# steps end bit-identical to 8 straight steps; metrics.jsonl, TensorBoard and the plot carry the
# DPO metrics with finite values; the memory plan equals the allocator's peaks to the byte; wrong data
# formats are refused with a clear message.
set -euo pipefail
MT=$(realpath "${1:?usage: train_dpo.sh MOETRAIN_BINARY}")
W=$(mktemp -d /tmp/mt_e2e_dpo.XXXXXX)
trap "rm -rf \"$W\"" EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 "$(dirname "$0")/lib/make_tiny_tokenizer.py" "$W/tok"
python3 - "$W" <<'PY'
import json, os, sys, random
w = sys.argv[1]
json.dump({"model_type": "qwen3_moe", "vocab_size": 264, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
           "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
           "max_position_embeddings": 512, "tie_word_embeddings": False},
          open(os.path.join(w, "config.json"), "w"))
rng = random.Random(5)
with open(os.path.join(w, "pref.jsonl"), "w") as f:
    for i in range(80):
        word = "".join(rng.choice("abcdefgh") for _ in range(4))
        f.write(json.dumps({"prompt": f"say {word}", "chosen": word.upper(), "rejected": word[::-1]}) + "\n")
PY

cat > "$W/cfg.yaml" <<YAML
model: {config: $W/config.json, tokenizer: $W/tok}
data: {data_path: [$W/pref.jsonl], split: "80,20,0", format: preference}
training: {objective: dpo, seq_length: 32, micro_batch_size: 2, global_batch_size: 4, train_iters: 8,
           eval_interval: 4, eval_iters: 2, device: cpu}
optimizer: {lr: 1.0e-2, lr_warmup_iters: 1, weight_decay: 0.0}
dpo: {beta: 0.5}
checkpoint: {save_interval: 4, keep_last: 2, export_hf: false}
YAML
last() { grep '"type":"train"' "$1/metrics.jsonl" | tail -n 1; }

"$MT" train "$W/cfg.yaml" logging.run_dir="$W/straight" > "$W/straight.log" 2>&1 || { cat "$W/straight.log"; fail "straight run"; }
R=$W/resumed
"$MT" train "$W/cfg.yaml" logging.run_dir="$R" training.exit_interval=4 > "$W/first.log" 2>&1 || { cat "$W/first.log"; fail "first run"; }
grep -q "\[dpo\] computing reference log-probs" "$W/first.log" || { cat "$W/first.log"; fail "no reference pass"; }
[[ -f "$R/dpo_reference/train.safetensors" && -f "$R/dpo_reference/valid.safetensors" ]] || fail "reference files missing"
ref_before=$(md5sum "$R/dpo_reference/train.safetensors")
"$MT" train "$W/cfg.yaml" logging.run_dir="$R" > "$W/second.log" 2>&1 || { cat "$W/second.log"; fail "resumed run"; }
grep -q "resuming from .*step_4" "$W/second.log" || fail "the second run did not resume from step_4"
[[ "$(md5sum "$R/dpo_reference/train.safetensors")" == "$ref_before" ]] || fail "reference file rewritten on resume"
grep -q "\[dpo\] reusing reference log-probs" "$W/second.log" || { cat "$W/second.log"; fail "reference not reused on resume"; }
same=$(python3 -c '
import json, sys
a, b = (json.loads(l) for l in sys.argv[1:])
print(all(a[k] == b[k] for k in ["loss", "dpo_loss", "grad_norm", "rewards/margins", "logps/chosen", "logps/rejected"]))
' "$(last "$R")" "$(last "$W/straight")")
[[ "$same" == True ]] || fail "resumed run differs: $(last "$R") vs $(last "$W/straight")"
[[ $(grep -c '"type":"train"' "$R/metrics.jsonl") -eq 8 ]] || fail "metrics.jsonl should hold 8 train lines"

python3 - "$R/metrics.jsonl" <<'PY' || fail "DPO metrics"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in recs if r["type"] == "train"]; valid = [r for r in recs if r["type"] == "valid"]
assert [r["step"] for r in valid] == [0, 4, 8], valid
keys = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracy", "logps/chosen", "logps/rejected"]
for r in train + valid:
    for k in keys + ["pairs"]:
        assert k in r and math.isfinite(r[k]), (k, r)
    assert 0 <= r["rewards/accuracy"] <= 1
    assert abs(r["rewards/margins"] - (r["rewards/chosen"] - r["rewards/rejected"])) < 1e-9
for r in train:
    assert r["pairs"] == 4 and math.isfinite(r["dpo_loss"]), r
assert abs(train[0]["dpo_loss"] - math.log(2)) < 1e-3, train[0]   # policy == reference at step 1
assert valid[-1]["pairs"] > 0
print("train dpo_loss", [round(r["dpo_loss"], 4) for r in train], "valid acc", [r["rewards/accuracy"] for r in valid])
PY
grep -q "preference accuracy" "$R/training.svg" || fail "plot has no DPO panels"
grep -aq "train/rewards/accuracy" "$R"/tensorboard/events.* || fail "TensorBoard has no DPO scalars"
grep -q "acc .* margin .* logp+ " "$W/second.log" || fail "console line lacks DPO metrics"

# The memory plan of a DPO step (two micro-batches of two pairs: the trainer holds both pair batches
# before its first pass) equals the allocator's peaks to the byte, every category, over three steps.
P=$W/planned
"$MT" plan "$W/cfg.yaml" --json logging.run_dir="$P" > "$W/plan.json" 2> "$W/plan.err" || { cat "$W/plan.err"; fail "plan"; }
"$MT" train "$W/cfg.yaml" logging.run_dir="$P" training.train_iters=3 training.eval_interval=0 \
  checkpoint.save_interval=0 > "$W/planned.log" 2>&1 || { cat "$W/planned.log"; fail "planned run"; }
python3 - "$W/plan.json" "$P/metrics.jsonl" <<'PY' || fail "DPO memory plan differs from the allocator"
import json, sys
plan = json.load(open(sys.argv[1]))["memory"]
recs = [r for r in (json.loads(l) for l in open(sys.argv[2]) if l.strip()) if r.get("type") == "train" and "memory" in r]
assert len(recs) == 3, len(recs)
off = {}
for cat in ["weights", "gradients", "master", "optimizer", "activations", "workspace", "other", "total"]:
    pred = plan["allocator_peak"] if cat == "total" else plan["category_peak"][cat]
    meas = max(r["memory"][cat]["peak"] for r in recs)
    if pred != meas:
        off[cat] = meas - pred
assert not off, f"measured - planned bytes: {off}"
PY

# Wrong data: a chat file for DPO, preference data for SFT.
echo '{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}' > "$W/chat.jsonl"
if "$MT" train "$W/cfg.yaml" logging.run_dir="$W/bad1" data.data_path="[$W/chat.jsonl]" data.format=chat > "$W/bad1.log" 2>&1; then
  fail "chat data accepted for dpo"; fi
grep -q "objective dpo needs preference records" "$W/bad1.log" || { cat "$W/bad1.log"; fail "chat-for-dpo message"; }
if "$MT" train "$W/cfg.yaml" logging.run_dir="$W/bad2" training.objective=sft > "$W/bad2.log" 2>&1; then
  fail "preference data accepted for sft"; fi
grep -q "data.format preference is for training.objective dpo" "$W/bad2.log" || { cat "$W/bad2.log"; fail "pref-for-sft message"; }
echo "train_dpo: ok"
