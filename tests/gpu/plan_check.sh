#!/usr/bin/env bash
# plan_check.sh MOETRAIN_BINARY: the planner's memory predictions against the allocator. For each
# config below it runs `moetrain plan --json` and `moetrain train` (mock data, 3 steps, --force),
# takes the per-category peaks of metrics.jsonl (max over steps of memory.<category>.peak, and
# memory.total.peak) and prints predicted vs measured with the error in %; the Markdown table goes
# to $OUT/plan_check.md. Exit status 1 when a category above 16 MiB is off by more than 10%
# (on the CPU: when any category is off by a byte).
# GPU (default): Qwen3-30B-A3B at 2 layers full width and Qwen3-0.6B at 4 layers, micro-batch,
# seq 2048/4096 and recompute none/selective/full varied (the trainer runs AdamW only).
# PLAN_CHECK_DEVICE=cpu: the same logic on tiny presets on the CPU (tests the script; the CPU
# allocator accounts memory the same way, so there the prediction must be exact to the byte).
set -uo pipefail
MT=$(realpath "${1:?usage: plan_check.sh MOETRAIN_BINARY}")
out=${OUT:-/tmp/moetrain-plan-check}
mkdir -p "$out"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
device=${PLAN_CHECK_DEVICE:-cuda}

# name preset layers micro_batch seq recompute
if [ "$device" = cpu ]; then
  min_bytes=0
  configs=(
    "moe-mb1-s64-none tiny-moe 0 1 64 none"
    "moe-mb2-s32-selective tiny-moe 0 2 32 selective"
    "moe-mb1-s64-full tiny-moe 0 1 64 full"
    "dense-mb2-s64-none tiny-dense 0 2 64 none"
    "dense-mb1-s64-selective tiny-dense 0 1 64 selective"
    "dense-mb3-s32-full tiny-dense 0 3 32 full"
  )
else
  min_bytes=$((16 << 20))
  configs=(
    "30b-a3b-L2-mb1-s4096-none qwen3-30b-a3b 2 1 4096 none"
    "30b-a3b-L2-mb2-s2048-none qwen3-30b-a3b 2 2 2048 none"
    "30b-a3b-L2-mb2-s4096-selective qwen3-30b-a3b 2 2 4096 selective"
    "30b-a3b-L2-mb1-s2048-full qwen3-30b-a3b 2 1 2048 full"
    "30b-a3b-L2-mb4-s4096-full qwen3-30b-a3b 2 4 4096 full"
    "0.6b-L4-mb1-s4096-none qwen3-0.6b 4 1 4096 none"
    "0.6b-L4-mb4-s2048-selective qwen3-0.6b 4 4 2048 selective"
    "0.6b-L4-mb8-s4096-full qwen3-0.6b 4 8 4096 full"
  )
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/plan_check_gpu.txt" 2>/dev/null || true
fi

for c in "${configs[@]}"; do
  read -r name preset layers mbs seq rc <<< "$c"
  cfg=$W/$name.yaml
  cat > "$cfg" <<YAML
model: {preset: $preset, num_layers: $layers}
data: {mock_data: true}
training: {objective: pretrain, seq_length: $seq, micro_batch_size: $mbs, global_batch_size: $mbs, train_iters: 3,
           eval_interval: 0, eval_iters: 0, device: $device, bf16: true, recompute_granularity: $rc}
optimizer: {lr: 1.0e-5}
checkpoint: {save_interval: 0, export_hf: false, load: none}
logging: {run_dir: $W/run-$name, log_interval: 1, tensorboard: false, plot: false}
YAML
  "$MT" plan "$cfg" --json > "$W/$name.plan.json" 2> "$out/$name.plan.log" || echo "plan failed for $name (see $out/$name.plan.log)"
  start=$(date +%s)
  "$MT" train "$cfg" --force > "$out/$name.train.log" 2>&1 || echo "train failed for $name (see $out/$name.train.log)"
  echo "$name: train $(( $(date +%s) - start )) s"
  cp "$W/run-$name/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null || true
  cp "$W/$name.plan.json" "$out/$name.plan.json" 2>/dev/null || true
done

python3 - "$out" "$min_bytes" "$device" "${configs[@]}" <<'PY'
import json, os, sys
out, min_bytes, device, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
exact = device == "cpu"
cats = ["weights", "gradients", "master", "optimizer", "activations", "workspace", "other", "total"]
mib = lambda b: f"{b / 2**20:.1f}"
rows, bad = [], []
for c in configs:
    name = c.split()[0]
    try:
        plan = json.load(open(f"{out}/{name}.plan.json"))["memory"]
        recs = [json.loads(l) for l in open(f"{out}/{name}.metrics.jsonl") if l.strip()]
        recs = [r for r in recs if r.get("type") == "train" and "memory" in r]
        assert recs, "no train records"
    except Exception as e:  # a failed run is a row of its own
        rows.append(f"| {name} | (no result: {e}) | | | | |")
        bad.append(f"{name}: no result")
        continue
    for cat in cats:
        pred = plan["allocator_peak"] if cat == "total" else plan["category_peak"][cat]
        meas = max(r["memory"][cat]["peak"] for r in recs)
        if pred == 0 and meas == 0:
            continue
        err = 100.0 * (pred - meas) / meas if meas else float("inf")
        flag = ""
        if exact and pred != meas:
            flag = f" **{meas - pred:+.0f} bytes**"
            bad.append(f"{name} {cat}: measured {meas - pred:+.0f} bytes from the plan")
        elif max(pred, meas) > min_bytes and abs(err) > 10.0:
            flag = " **over 10%**"
            bad.append(f"{name} {cat}: {err:+.1f}%")
        rows.append(f"| {name} | {cat} | {mib(pred)} | {mib(meas)} | {meas - pred:+.0f} | {err:+.2f}%{flag} |")
gpu = open(f"{out}/plan_check_gpu.txt").read().strip() if os.path.exists(f"{out}/plan_check_gpu.txt") else "cpu"
md = [f"Planner vs allocator ({gpu}): peak bytes per category over 3 steps, MiB; error = (predicted - measured) / measured.",
      "", "| run | category | predicted MiB | measured MiB | measured - predicted, bytes | error |",
      "|---|---|---:|---:|---:|---:|"] + rows
ok_line = "all categories equal to the byte" if exact else "all categories above %d MiB within 10%%" % (min_bytes >> 20)
md += ["", ok_line if not bad else "off: " + "; ".join(bad)]
open(f"{out}/plan_check.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(1 if bad else 0)
PY
