#!/usr/bin/env python3
"""The worked answer's table in docs/plan.md, from `moetrain plan --json`.

Usage: python3 bench/plan_worked_answer.py MOETRAIN_BINARY

Qwen3-30B-A3B, SFT on 300M tokens at 8K then DPO on 100M at 4K, on 8x MI300X, 8x H100 and 4x H200
(expert parallel over all GPUs), with AdamW, 8-bit AdamW and Muon. For each, the first recompute
policy of none / selective / full that fits, and that plan's numbers, as one Markdown row.
"""
import json
import subprocess
import sys

GIB = float(1 << 30)
MACHINES = [("mi300x", 8), ("h100", 8), ("h200", 4)]
OPTIMIZERS = [("adamw", "AdamW"), ("adamw8bit", "8-bit AdamW"), ("muon", "Muon")]
STAGES = [
    ("SFT 8K", "300M", ["training.seq_length=8192", "training.global_batch_size=64"]),
    ("DPO 4K", "100M", ["training.objective=dpo", "training.seq_length=4096", "training.global_batch_size=32"]),
]


def plan(binary, gpu, gpus, optimizer, tokens, keys, recompute):
    cmd = [binary, "plan", "--model", "qwen3-30b-a3b", "--gpu", gpu, "--gpus", str(gpus), "--ep", str(gpus),
           "--optimizer", optimizer, "--tokens", tokens, "--json"] + keys + [
               f"training.recompute_granularity={recompute}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def row(binary, gpu, gpus, optimizer, stage, tokens, keys):
    for recompute in ("none", "selective", "full"):
        p = plan(binary, gpu, gpus, optimizer, tokens, keys, recompute)
        if p["verdict"]["fits"]:
            break
    c = p["memory"]["category_peak"]
    state = (c["weights"] + c["gradients"] + c["master"] + c["optimizer"]) / GIB
    act = (c["activations"] + c["workspace"]) / GIB
    total, balanced = p["memory"]["device_total"] / GIB, p["memory"]["device_total_expected"] / GIB
    cap = p["hardware"]["gpu_mem_bytes"] / GIB
    fits = "" if p["verdict"]["fits"] else " (does not fit)"
    t = p["time"]
    return (f"| {gpus}x {gpu.upper() if gpu != 'mi300x' else 'MI300X'} | {optimizer} | {stage} | {recompute} | "
            f"{state:.1f} GiB | {act:.1f} GiB | {total:.1f} GiB ({balanced:.1f}) of {cap:.1f}{fits} | "
            f"{p['verdict']['max_micro_batch']} | {t['tokens_per_s_per_gpu']:,.0f} | {t['total_time_s'] / 3600:.2f} h |")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "build/moetrain"
    print("| GPUs | optimizer | stage | recompute | state | activations + head | total per GPU (balanced routing) "
          "| largest micro-batch | tokens/s/GPU | time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for gpu, gpus in MACHINES:
        for opt, name in OPTIMIZERS:
            for stage, tokens, keys in STAGES:
                print(row(binary, gpu, gpus, opt, stage, tokens, keys).replace(f"| {opt} |", f"| {name} |", 1))


if __name__ == "__main__":
    main()
