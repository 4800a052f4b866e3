#!/usr/bin/env bash
# `moetrain bench` on the CPU with tiny-moe (1 and 2 layers, seq 64, --profile --kernels --json):
# the JSON has every field with sane values, the projection and per-op attribution follow their
# formulas, the FLOPs/token match SPEC section 10 computed here, the planner's peak is within 10% of
# the allocator's, the chunked loss head holds less than the unfused one; without a GPU the energy
# fields are empty and --energy-s says why; --kernel-groups runs only its groups; bad options fail clearly.
# $1 = moetrain binary.
set -euo pipefail
MT=$(realpath "${1:?usage: bench_cpu.sh MOETRAIN_BINARY}")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
start=$(date +%s)
"$MT" bench --model tiny-moe --layers 1,2 --seq 64 --steps 2 --warmup 1 --device cpu --profile --kernels \
  --json "$W/x.json" > "$W/out.txt" 2> "$W/err.txt" || { cat "$W/out.txt" "$W/err.txt"; exit 1; }
secs=$(( $(date +%s) - start ))
grep -q "L=2 timed step 2/2" "$W/err.txt" || { echo "no progress lines"; cat "$W/err.txt"; exit 1; }
grep -q "^projection to 2 layers" "$W/out.txt" || { echo "no projection line"; cat "$W/out.txt"; exit 1; }
python3 - "$W/x.json" "$secs" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
secs = int(sys.argv[2])
fails = []
def check(cond, what):
    if not cond:
        fails.append(what)
def close(a, b, rel=1e-6, abs_=1e-9):
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))

check(secs < 30, f"took {secs} s (limit 30)")
check(j["device"]["type"] == "cpu", "device type")
g = j["gemm_ceiling"]
check(g["n"] == 256 and g["ms"] > 0 and close(g["tflops"], 2 * 256**3 / (g["ms"] * 1e-3) / 1e12, 1e-6), "gemm ceiling")
s = j["settings"]
check(s["num_hidden_layers"] == 2 and s["seq"] == 64 and s["layers"] == [1, 2], "settings")
runs = j["runs"]
check([r["layers"] for r in runs] == [1, 2], "runs layers")

# SPEC section 10 for tiny-moe (H 64, 4/2 heads of 16, 4 experts top-2 of width 32, vocab 256).
def fpt(layers, s_avg, H=64, nh=4, nkv=2, d=16, E=4, k=2, I=32, V=256):
    mm = V * H + layers * (2 * H * nh * d + 2 * H * nkv * d + E * H + k * 3 * I * H)
    return 6 * mm + 6 * layers * 2 * nh * d * s_avg

for r in runs:
    L = r["layers"]
    check(len(r["step_ms_all"]) == 2 and len(r["warmup_ms"]) == 1, f"L{L} step counts")
    check(all(t > 0 for t in r["step_ms_all"]) and r["step_ms"] > 0, f"L{L} times")
    check(close(r["step_ms"], sorted(r["step_ms_all"])[0] / 2 + sorted(r["step_ms_all"])[1] / 2), f"L{L} median")
    check(r["tokens_per_step"] == 64, f"L{L} tokens")
    check(1 <= r["mean_attended"] <= 64.5, f"L{L} mean attended {r['mean_attended']}")
    check(close(r["flops_per_step"] / 64, fpt(L, r["mean_attended"]), 1e-6), f"L{L} flops/token vs SPEC 10")
    check(close(r["tokens_per_s"], 64 / (r["step_ms"] * 1e-3), 1e-9), f"L{L} tokens/s")
    check(close(r["model_tflops"], r["flops_per_step"] / (r["step_ms"] * 1e-3) / 1e12, 1e-9), f"L{L} TFLOP/s")
    check(r["mfu"] is None, f"L{L} mfu without a known peak")
    check(r["peak_bytes"] > 0 and r["planned_peak_bytes"] > 0, f"L{L} peaks")
    check(abs(r["planned_peak_bytes"] - r["peak_bytes"]) <= 0.10 * r["peak_bytes"],
          f"L{L} plan {r['planned_peak_bytes']} vs measured {r['peak_bytes']}")
    p = r["profile"]
    check(p["steps"] == 2 and p["step_ms"] > 0, f"L{L} profile steps")
    names = {o["name"] for o in p["ops"]}
    check({"matmul", "attention_forward", "attention_backward", "adamw_step_many", "grouped_matmul"} <= names,
          f"L{L} ops {sorted(names)}")
    osum = sum(o["ms_per_step"] for o in p["ops"])
    check(close(osum, p["op_sum_ms"], 1e-9), f"L{L} op sum")
    check(0 < p["op_sum_ms"] <= p["step_ms"] * 1.05, f"L{L} op sum {p['op_sum_ms']} vs step {p['step_ms']}")
    check(close(p["gap_ms"], p["step_ms"] - p["op_sum_ms"], 1e-9), f"L{L} gap")
    regions = {o["name"]: o for o in p["regions"]}
    check({"forward_backward", "grad_norm", "optimizer", "zero_grad"} <= set(regions), f"L{L} regions {sorted(regions)}")
    # the trainer's regions once per step, the layer's projection regions once per layer
    check(all(abs(o["calls_per_step"] - (L if o["name"].startswith("proj_") else 1)) < 1e-9 for o in p["regions"]),
          f"L{L} region calls")
    check({"proj_qkv_fwd", "proj_o_fwd", "proj_o_bwd", "proj_qkv_bwd"} <= set(regions), f"L{L} projection regions")
    check(regions["forward_backward"]["ms_per_step"] <= p["step_ms"] * 1.05, f"L{L} fwd+bwd region <= step")

pr = j["projection"]
t1, t2 = runs[0]["step_ms"], runs[1]["step_ms"]
check(close(pr["per_layer_ms"], (t2 - t1) / 1), "per-layer formula")
check(close(pr["fixed_ms"], t1 - 1 * pr["per_layer_ms"]), "fixed formula")
check(close(pr["step_ms"], pr["fixed_ms"] + 2 * pr["per_layer_ms"]), "projection formula")
check(pr["full_layers"] == 2 and close(pr["step_ms"], t2, 1e-9, 1e-9), "2-layer projection of a 2-layer model is t2")
check(close(pr["flops_per_token"], fpt(2, runs[1]["mean_attended"]), 1e-6), "projection flops/token")
if pr["step_ms"] > 0:
    check(close(pr["tokens_per_s"], 64 / (pr["step_ms"] * 1e-3), 1e-9), "projected tokens/s")
    check(close(pr["model_tflops"], pr["tokens_per_s"] * pr["flops_per_token"] / 1e12, 1e-9), "projected TFLOP/s")
    check(close(pr["pct_of_gemm_ceiling"], 100 * pr["model_tflops"] / g["tflops"], 1e-9), "% of GEMM ceiling")

attr = {a["name"]: a for a in j["profile_attribution"]}
for n, a in attr.items():
    check(close(a["per_layer_ms"], a["ms_b"] - a["ms_a"], 1e-9, 1e-12), f"attribution per layer {n}")
    check(close(a["fixed_ms"], a["ms_a"] - a["per_layer_ms"], 1e-9, 1e-12), f"attribution fixed {n}")
check("attention_forward" in attr and "step - sum" in attr and "region optimizer" in attr, "attribution rows")

k = {r["key"]: r for r in j["kernels"]}
want = [f"gmm.{c}.{p}" for c in ("gate_up", "down")
        for p in ("fwd", "dx", "dw", "bwd", "dw_f32acc", "dw_ss", "dw_ss_b2b", "fwd_b2b", "dw_b2b", "bwd_b2b")]
want += [f"attn.{c}.{p}" for c in ("full", "packed") for p in ("fwd", "bwd")] + [f"loss_head.{v}{w}" for v in ("chunked", "unfused") for w in ("", ".write")]
want += [f"proj.qkv.{p}{w}" for p in ("fwd", "dx", "dw") for w in ("", ".one")] + [f"proj.o.{p}" for p in ("fwd", "dx", "dw")]
# the loss head's parts at the default chunk, which is all of T = 64 here (one row set, no duplicate keys)
want += [f"loss_head.part.r64.{p}" for p in ("fwd", "fwd_gmm", "ce", "dx", "dw", "dw_gmm", "dw_write", "dw_gmm_write")]
check(sorted(k) == sorted(want), f"kernel keys {sorted(k)}")
for key, r in k.items():
    check(r["ms"] >= 0 and (r["flops"] > 0 or key.endswith(".ce")), f"kernel {key} values")  # CE: no GEMM FLOPs
    if r["ms"] > 0:
        check(close(r["tflops"], r["flops"] / (r["ms"] * 1e-3) / 1e12, 1e-9), f"kernel {key} TFLOP/s")
        check(close(r["pct_of_gemm_ceiling"], 100 * r["tflops"] / g["tflops"], 1e-9), f"kernel {key} %")
    if key != "gmm.gate_up.dx" and key != "gmm.down.dx":
        check(r["ms"] > 0, f"kernel {key} time")
check(k["gmm.gate_up.fwd"]["flops"] == 2 * 64 * 2 * 64 * 64, "gate_up flops")  # N = T k, K = H, M = 2 I
for key, r in k.items():  # the host's time of one call: on the expert dW rows only, and measured
    gmm_dw = key in ("gmm.gate_up.dw", "gmm.down.dw")
    check(("host_us" in r) == gmm_dw, f"kernel {key} host_us present")
    if gmm_dw:
        check(r["host_us"] > 0, f"kernel {key} host_us {r['host_us']}")
for c in ("gate_up", "down"):  # the back-to-back rows: per call, the same work as the single-call rows
    for p in ("fwd", "dw", "bwd"):
        check(k[f"gmm.{c}.{p}_b2b"]["flops"] == k[f"gmm.{c}.{p}"]["flops"], f"gmm {c} {p}_b2b flops")
check(k["attn.full.fwd"]["flops"] == 4 * (64 * 65 / 2) * 16 * 4, "attention flops")
for p in ("fwd", "dx", "dw"):  # T 64, H 64, q 4 x 16, k and v 2 x 16 each
    check(k[f"proj.qkv.{p}"]["flops"] == k[f"proj.qkv.{p}.one"]["flops"] == 2 * 64 * 64 * (64 + 2 * 32), f"proj qkv {p} flops")
    check(k[f"proj.o.{p}"]["flops"] == 2 * 64 * 64 * 64, f"proj o {p} flops")
check(k["attn.packed.fwd"]["flops"] == 4 * 4 * (16 * 17 / 2) * 16 * 4, "packed attention flops (4 docs of 16)")
for p in ("fwd", "fwd_gmm", "dx", "dw", "dw_gmm", "dw_write", "dw_gmm_write"):  # n 64 rows, H 64, V 256
    check(k[f"loss_head.part.r64.{p}"]["flops"] == 2 * 64 * 64 * 256, f"loss head part {p} flops")
logits = 64 * 256 * 4  # [T, V] f32 on the CPU
ch, un = k["loss_head.chunked"]["peak_extra_bytes"], k["loss_head.unfused"]["peak_extra_bytes"]
check(0 < ch <= logits * 1.01, f"chunked loss head holds {ch} bytes (one chunk {logits})")
check(un >= 2 * logits, f"unfused loss head holds {un} bytes (logits + dlogits {2 * logits})")
# No GPU, so no energy counter: the energy fields are there and empty, never a made-up number.
for r in runs:
    check(r["joules_per_step"] is None and r["mean_watts"] is None and r["power_limit_w"] is None,
          f"L{r['layers']} energy without a GPU")
check(pr["per_layer_joules"] is None and pr["step_joules"] is None, "projection energy without a GPU")
check(all("joules" not in r for r in j["kernels"]), "kernel energy without --energy-s")
if fails:
    print("bench_cpu.sh FAILED:\n  " + "\n  ".join(fails))
    sys.exit(1)
print(f"bench json ok ({secs} s)")
PY

# One depth: no projection, measured as is; bad options fail with a message.
"$MT" bench --model tiny-dense --layers 2 --seq 32 --steps 1 --warmup 0 --device cpu --json "$W/y.json" > "$W/out2.txt" 2>&1 \
  || { cat "$W/out2.txt"; exit 1; }
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['projection'] is None and len(j['runs']) == 1 \
and j['runs'][0]['tokens_per_s'] > 0 and 'kernels' not in j, j" "$W/y.json"
grep -q "measured at 2 layers (no projection)" "$W/out2.txt" || { cat "$W/out2.txt"; exit 1; }
if "$MT" bench --model tiny-moe --layers 0,2 --device cpu > "$W/bad.txt" 2>&1; then echo "--layers 0 accepted"; exit 1; fi
grep -q "depth 0 must be >= 1" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
if "$MT" bench --model tiny-moe --device cpu --set optimizer.nope=1 --layers 1 > "$W/bad.txt" 2>&1; then
  echo "unknown --set key accepted"; exit 1
fi
grep -q "nope" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
if "$MT" bench --model tiny-moe --device cpu --layers 1 --energy-s 2 > "$W/bad.txt" 2>&1; then
  echo "--energy-s without --kernels accepted"; exit 1
fi
grep -q "energy-s 2 applies to the kernel cases" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
"$MT" bench --model tiny-moe --device cpu --seq 32 --kernels --no-steps --reps 1 --energy-s 0.1 > "$W/k.txt" 2>&1 \
  || { cat "$W/k.txt"; exit 1; }
grep -q "kernel energy: unavailable (no GPU)" "$W/k.txt" || { echo "no 'unavailable' line"; cat "$W/k.txt"; exit 1; }
# --kernel-groups: only the named groups' cases; an unknown group fails and names itself.
"$MT" bench --model tiny-moe --device cpu --seq 32 --kernels --no-steps --reps 1 --kernel-groups gmm,proj \
  --json "$W/g.json" > "$W/g.txt" 2>&1 || { cat "$W/g.txt"; exit 1; }
python3 -c "import json,sys; ks={r['key'].split('.')[0] for r in json.load(open(sys.argv[1]))['kernels']}; \
assert ks == {'gmm', 'proj'}, ks" "$W/g.json"
# (without --no-steps: the check comes before any step is timed, so a typo fails at once)
if "$MT" bench --model tiny-moe --device cpu --layers 1 --kernels --kernel-groups gmm,nope > "$W/bad.txt" 2>&1; then
  echo "--kernel-groups nope accepted"; exit 1
fi
grep -q "unknown group 'nope'" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
if grep -q "timed step" "$W/bad.txt"; then echo "--kernel-groups nope checked after the steps ran"; cat "$W/bad.txt"; exit 1; fi
if "$MT" bench --model tiny-moe --device cpu --layers 1 --kernel-groups gmm > "$W/bad.txt" 2>&1; then
  echo "--kernel-groups without --kernels accepted"; exit 1
fi
grep -q "kernel-groups applies to the kernel cases" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
echo "bench_cpu: ok"
