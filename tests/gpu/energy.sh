#!/usr/bin/env bash
# energy.sh (GPU machine, repo root): time and board energy of one Qwen3-30B-A3B layer's training step,
# moetrain (all-bf16, update in backward, as the issue-7 status rows) beside the PyTorch baseline
# (torch_anchor.py's model, grouped_mm + torch.compile), and the copy / GEMM ceilings in joules, all in
# one call, both read from NVML's energy counter. Bundle: tests/gpu/stage_perf.sh (GPU_BIN, default
# gpu-bin-perf). Env: STEPS (timed steps per depth for both sides: moetrain's default 30, energy_torch.py's
# 20; use 200 for joules good to a few percent), ROUNDS (1: ours then torch; 2 adds ours again),
# SKIP_TORCH=1. Logs and JSON in $OUT/energy/; the summary table is printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}/energy
mkdir -p "$out"
bin=${GPU_BIN:-$root/gpu-bin-perf}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
if [[ ! -x "$bin/moetrain" ]]; then
  mkdir -p /tmp/energy_bundle && tar -xJf "$bin/bundle.tar.xz" -C /tmp/energy_bundle && bin=/tmp/energy_bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
sets=()
for s in optimizer.main_grads_dtype=bf16 optimizer.main_params_dtype=bf16 optimizer.exp_avg_dtype=bf16 \
         optimizer.exp_avg_sq_dtype=bf16 optimizer.clip_grad=0 optimizer.update_in_backward=true; do
  sets+=(--set "$s")
done
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
ours() {
  timeout 240 "$bin/moetrain" bench --layers 2,4 --seq 4096 --mbs 1 --steps "${STEPS:-30}" "${sets[@]}" \
    --json "$out/ours_$1.json" > "$out/ours_$1.log" 2>&1
  echo "ours $1: rc $?"
  grep -E "^(2|4) |per layer|energy" "$out/ours_$1.log"
}
ours r1
if [[ "${SKIP_TORCH:-0}" != 1 ]]; then
  ANCHOR="$bin/torch_anchor.py" OUT="$out" PYTHONUNBUFFERED=1 timeout 420 python3 tests/gpu/energy_torch.py \
    > "$out/torch.log" 2>&1
  echo "torch: rc $?"
fi
(( ${ROUNDS:-1} >= 2 )) && ours r2
python3 - "$out" <<'EOF'
import json, os, sys, glob
d = sys.argv[1]
rows = []
for f in sorted(glob.glob(os.path.join(d, "ours_*.json"))):
    j = json.load(open(f)); p = j.get("projection") or {}
    runs = {r["layers"]: r for r in j.get("runs", [])}
    rows.append((os.path.basename(f)[5:-5], p.get("per_layer_ms"), p.get("per_layer_joules"),
                 runs.get(2, {}).get("mean_watts"), runs.get(4, {}).get("mean_watts")))
t = None
if os.path.exists(os.path.join(d, "energy_torch.json")):
    t = json.load(open(os.path.join(d, "energy_torch.json")))
print("\n| run | per layer ms | per layer J | mean W (2 / 4 layers) |")
print("|---|---|---|---|")
f = lambda x, n=3: "-" if x is None else f"{x:.{n}f}"
for name, ms, jl, w2, w4 in rows:
    print(f"| moetrain {name} | {f(ms)} | {f(jl)} | {f(w2, 0)} / {f(w4, 0)} |")
if t and "model" in t:
    m = t["model"]; w = {r["layers"]: r["watts"] for r in m["runs"]}
    print(f"| torch {m['impl']} | {f(m['per_layer_ms'])} | {f(m['per_layer_j'])} | {f(w.get(2), 0)} / {f(w.get(4), 0)} |")
    for name, ms, jl, *_ in rows:
        if ms and jl:
            print(f"ratio torch/moetrain {name}: time {m['per_layer_ms'] / ms:.2f}, energy {m['per_layer_j'] / jl:.2f}")
if t:
    print(f"limit {t['power_limit_w']:.0f} W, idle {t['idle_w']:.0f} W, counter every {t['counter_update_ms']} ms; "
          f"copy {t['copy']['tb_per_s']:.2f} TB/s {t['copy']['watts']:.0f} W {t['copy']['j_per_gb']:.3f} J/GB; "
          f"gemm {t['gemm']['tflops']:.0f} TFLOP/s {t['gemm']['watts']:.0f} W {t['gemm']['j_per_tflop']:.3f} J/TFLOP")
EOF
