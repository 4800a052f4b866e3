#!/usr/bin/env python3
# energy_torch.py (GPU machine): the board energy of the PyTorch baseline's training step, and of the
# two ceilings a step is built from, read from NVML's cumulative energy counter (pynvml, from the
# nvidia-ml-py package). Beside `moetrain bench`, which reads the same counter, it answers whether the
# step is bound by the board's power limit and what a step's bytes and FLOPs cost in joules.
#   1. the counter's update interval (polled for 0.3 s);
#   2. idle power (1 s, nothing queued), a device-to-device copy (2 GiB buffers, about 2 s: J per GB
#      moved, reads plus writes) and a bf16 8192^3 GEMM (about 2 s: J per TFLOP);
#   3. torch_anchor.py's Qwen3-30B-A3B proxy (transformers, grouped_mm, fused AdamW, torch.compile by
#      default) at 2 and 4 layers, seq SEQ: median step ms (CUDA events) and J per step over STEPS steps;
#      per layer = (L4 - L2) / 2 for both.
# Env: ANCHOR (path of torch_anchor.py; default: beside this script's bundle or ../shared/bench), SEQ
# (4096), MBS (1), STEPS (20), IMPL (grouped_mm+compile), SKIP_MODEL=1 (ceilings only). Prints one JSON
# line per result and a summary last; writes $OUT/energy_torch.json when OUT is set.
import importlib.util
import json
import os
import statistics
import sys
import time

import pynvml
import torch

dev = "cuda"


def load_anchor():
    cands = [os.environ.get("ANCHOR", ""), os.path.join(os.path.dirname(__file__), "../../../shared/bench/torch_anchor.py")]
    for c in cands:
        if c and os.path.isfile(c):
            spec = importlib.util.spec_from_file_location("torch_anchor", c)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)  # its measurements run only under __main__
            return mod
    sys.exit("energy_torch.py: no torch_anchor.py (set ANCHOR)")


def nvml_handle():
    """NVML's handle for CUDA device 0, found by PCI address (NVML ignores CUDA_VISIBLE_DEVICES)."""
    pynvml.nvmlInit()
    p = torch.cuda.get_device_properties(0)
    if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        bus = "%08x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
    return pynvml.nvmlDeviceGetHandleByIndex(0)


H = nvml_handle()


def joules():
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(H) * 1e-3


def window(fn, n):
    """Runs fn n times between two synchronized counter reads: (J, seconds)."""
    torch.cuda.synchronize()
    e0, t0 = joules(), time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return joules() - e0, time.perf_counter() - t0


def update_interval_ms():
    e, changes, t0 = joules(), 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        v = joules()
        if v != e:
            changes, e = changes + 1, v
    return 300.0 / changes if changes else float("inf")


def ceilings(res):
    res["counter_update_ms"] = round(update_interval_ms(), 2)
    torch.cuda.synchronize()
    e0, t0 = joules(), time.perf_counter()
    time.sleep(1.0)
    res["idle_w"] = round((joules() - e0) / (time.perf_counter() - t0), 1)
    n = 1 << 30  # 2 GiB of bf16 per buffer
    a = torch.randn(n, device=dev, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    cp = lambda: b.copy_(a)
    for _ in range(3):
        cp()
    j, s = window(cp, 1)
    reps = max(5, int(2.0 / max(s, 1e-3)))
    j, s = window(cp, reps)
    gb = 2 * n * 2 * reps / 1e9  # read + write
    res["copy"] = {"tb_per_s": round(gb / s / 1e3, 3), "watts": round(j / s, 1), "j_per_gb": round(j / gb, 4),
                   "j_per_gb_above_idle": round((j - res["idle_w"] * s) / gb, 4)}
    del a, b
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    mm = lambda: x @ y
    for _ in range(3):
        mm()
    j, s = window(mm, 1)
    reps = max(5, int(2.0 / max(s, 1e-3)))
    j, s = window(mm, reps)
    tf = 2 * 8192 ** 3 * reps / 1e12
    res["gemm"] = {"tflops": round(tf / s, 1), "watts": round(j / s, 1), "j_per_tflop": round(j / tf, 4),
                   "j_per_tflop_above_idle": round((j - res["idle_w"] * s) / tf, 4)}
    del x, y
    torch.cuda.empty_cache()
    print(json.dumps({k: res[k] for k in ("counter_update_ms", "idle_w", "copy", "gemm")}), flush=True)


def step_energy(anchor, L, impl, seq, mbs, steps):
    torch.manual_seed(0)
    cfg = anchor.make_cfg(L)
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        m = anchor.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    name = impl.split("+")[0]
    if name and hasattr(m, "set_experts_implementation"):
        m.set_experts_implementation(name)
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=True)
    fwd = torch.compile(m) if impl.endswith("+compile") else m
    x = torch.randint(0, 151936, (mbs, seq), device=dev)

    def step():
        fwd(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    ts = []
    for _ in range(5):  # CUDA-event median, as torch_anchor.py times
        s_, e_ = torch.cuda.Event(True), torch.cuda.Event(True)
        s_.record(); step(); e_.record(); torch.cuda.synchronize()
        ts.append(s_.elapsed_time(e_))
    j, s = window(step, steps)
    del m, opt, fwd
    torch.cuda.empty_cache()
    return {"layers": L, "step_ms": round(statistics.median(ts), 3), "window_ms_per_step": round(s / steps * 1e3, 3),
            "j_per_step": round(j / steps, 3), "watts": round(j / s, 1)}


def main():
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(H) / 1000.0}
    ceilings(res)
    if os.environ.get("SKIP_MODEL") != "1":
        anchor = load_anchor()
        seq, mbs = int(os.environ.get("SEQ", 4096)), int(os.environ.get("MBS", 1))
        steps, impl = int(os.environ.get("STEPS", 20)), os.environ.get("IMPL", "grouped_mm+compile")
        runs = {}
        for L in (2, 4):
            runs[L] = step_energy(anchor, L, impl, seq, mbs, steps)
            print(json.dumps({"impl": impl, **runs[L]}), flush=True)
        res["model"] = {"impl": impl, "seq": seq, "mbs": mbs, "runs": list(runs.values()),
                        "per_layer_ms": round((runs[4]["step_ms"] - runs[2]["step_ms"]) / 2, 3),
                        "per_layer_j": round((runs[4]["j_per_step"] - runs[2]["j_per_step"]) / 2, 4)}
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "energy_torch.json"), "w") as f:
            json.dump(res, f, indent=1)
    c, g = res["copy"], res["gemm"]
    print(f"\nlimit {res['power_limit_w']:.0f} W, idle {res['idle_w']:.0f} W, counter updates every "
          f"{res['counter_update_ms']} ms")
    print(f"copy  {c['tb_per_s']:.2f} TB/s at {c['watts']:.0f} W: {c['j_per_gb']:.3f} J/GB "
          f"({c['j_per_gb_above_idle']:.3f} above idle)")
    print(f"gemm  {g['tflops']:.0f} TFLOP/s at {g['watts']:.0f} W: {g['j_per_tflop']:.3f} J/TFLOP "
          f"({g['j_per_tflop_above_idle']:.3f} above idle)")
    if "model" in res:
        mdl = res["model"]
        for r in mdl["runs"]:
            print(f"torch {mdl['impl']} L={r['layers']}: {r['step_ms']:.2f} ms/step, {r['j_per_step']:.2f} J/step, "
                  f"{r['watts']:.0f} W")
        print(f"torch per layer: {mdl['per_layer_ms']:.3f} ms, {mdl['per_layer_j']:.3f} J")


if __name__ == "__main__":
    main()
