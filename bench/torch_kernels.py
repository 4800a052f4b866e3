#!/usr/bin/env python3
# PyTorch reference timings for `moetrain bench --kernels` on the same shapes: torch._grouped_mm on
# the Qwen3-30B-A3B expert GEMMs (32768 routed rows, 128 experts; forward, dX, dW as bf16 GEMMs),
# flash scaled_dot_product_attention (causal, GQA 32/4, d 128; forward, backward) and the unfused
# loss head (logits GEMM + F.cross_entropy, forward + backward, V 151936). Random inputs, warm-up,
# median of CUDA-event timings. Prints lines prefixed "torch"; --json FILE writes the rows with the
# keys moetrain bench --json uses (gmm.gate_up.fwd, attn.full.bwd, loss_head.unfused, ...).
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F


# MT_BENCH_BUSY_MIB=N (as moetrain bench's): N MiB of random fill queued before each timed sample, so that
# the first event is recorded on a busy GPU.
BUSY_MIB = int(os.environ.get("MT_BENCH_BUSY_MIB", "0") or 0)
_busy = None


def busy_gpu():
    global _busy
    if BUSY_MIB <= 0:
        return
    if _busy is None:
        _busy = torch.empty(BUSY_MIB << 18, device="cuda", dtype=torch.float32)
    _busy.normal_()


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        busy_gpu()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


B2B = 10


def host_us(fn, reps):
    """Median host time of one call issued on an idle GPU, in us (moetrain bench's host_us)."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


def b2b_ms(fn, reps):
    def many():
        for _ in range(B2B):
            fn()
    return median_ms(many, reps) / B2B


ROWS = []


def row(name, ms, flops, key=None, **extra):
    host = f"  host {extra['host_us']:.1f} us" if "host_us" in extra else ""
    print(f"torch {name:<34} {ms:9.3f} ms {flops / (ms * 1e-3) / 1e12:8.1f} TFLOP/s{host}", flush=True)
    ROWS.append({"key": key, "name": name, "ms": ms, "flops": flops, "tflops": flops / (ms * 1e-3) / 1e12, **extra})


def route_offsets(T, k, E, seed):
    g = torch.Generator().manual_seed(seed)
    picks = torch.rand(T, E, generator=g).argsort(dim=1)[:, :k]
    counts = torch.bincount(picks.flatten(), minlength=E)
    return torch.cumsum(counts, 0).to(torch.int32)


def bench_gemm(T, reps):
    E, k = 128, 8
    N = T * k
    ends = route_offsets(T, k, E, 42).cuda()  # offs = group ends, on the device
    for name, K, M in (("gate_up 2048->1536", 2048, 1536), ("down 768->2048", 768, 2048)):
        x = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(E, M, K, device="cuda", dtype=torch.bfloat16) * 0.02
        dy = torch.randn(N, M, device="cuda", dtype=torch.bfloat16)
        f = 2.0 * N * K * M
        tag = f"gmm {name} T{T}"
        wt = w.transpose(-2, -1)  # [E, K, M] view, as transformers passes it
        kk = "gmm." + name.split()[0] + "."
        row(tag + " fwd", median_ms(lambda: torch._grouped_mm(x, wt, offs=ends), reps), f, kk + "fwd")
        row(tag + " dx", median_ms(lambda: torch._grouped_mm(dy, w, offs=ends), reps), f, kk + "dx")
        try:
            dyt = dy.t()
            dw_host = host_us(lambda: torch._grouped_mm(dyt, x, offs=ends), reps)
            row(tag + " dw(bf16)", median_ms(lambda: torch._grouped_mm(dyt, x, offs=ends), reps), f, kk + "dw",
                host_us=dw_host)
            # B2B calls between one pair of events, per call (moetrain bench's "10 back to back" rows): the
            # host runs ahead, so its time to each launch is hidden as in a training step.
            row(tag + " fwd, 10 back to back", b2b_ms(lambda: torch._grouped_mm(x, wt, offs=ends), reps), f,
                kk + "fwd_b2b")
            row(tag + " dw(bf16), 10 back to back", b2b_ms(lambda: torch._grouped_mm(dyt, x, offs=ends), reps), f,
                kk + "dw_b2b")
            row(tag + " dx + dw(bf16), 10 back to back",
                b2b_ms(lambda: (torch._grouped_mm(dy, w, offs=ends), torch._grouped_mm(dyt, x, offs=ends)), reps),
                2 * f, kk + "bwd_b2b")
        except Exception as e:  # noqa: BLE001
            print(f"torch {tag} dw: {type(e).__name__}: {str(e)[:120]}")
        xg = x.clone().requires_grad_(True)
        wg = wt.detach().clone().requires_grad_(True)

        def bwd():
            y = torch._grouped_mm(xg, wg, offs=ends)
            y.backward(dy)
        try:
            fb = median_ms(bwd, reps)
            fo = median_ms(lambda: torch._grouped_mm(xg, wg, offs=ends), reps)
            row(tag + " bwd(autograd)", fb - fo, 2 * f, kk + "bwd")
        except Exception as e:  # noqa: BLE001
            print(f"torch {tag} autograd: {type(e).__name__}: {str(e)[:120]}")


def bench_attention(T, reps, key_kind):
    nh, nkv, d = 32, 4, 128
    q = torch.randn(1, nh, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, nkv, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, nkv, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, nh, T, d, device="cuda", dtype=torch.bfloat16)
    f = 4.0 * (T * (T + 1) / 2) * d * nh
    tag = f"attn T{T} doc{T}"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        try:
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            fwd()
            note = ""
        except Exception:  # noqa: BLE001  flash without native GQA: expand kv heads (not timed)
            kr = k.detach().repeat_interleave(nh // nkv, 1).requires_grad_(True)
            vr = v.detach().repeat_interleave(nh // nkv, 1).requires_grad_(True)
            fwd = lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)  # noqa: E731
            note = " (kv expanded)"
        with torch.no_grad():
            row(tag + " fwd" + note, median_ms(fwd, reps), f, f"attn.{key_kind}.fwd")
        out = fwd()
        tb = median_ms(lambda: torch.autograd.grad(out, (q, k, v) if not note else (q,), g, retain_graph=True), reps)
        row(tag + " bwd" + note, tb, 2.5 * f, f"attn.{key_kind}.bwd")


def bench_loss_head(T, reps, H=2048, V=151936):
    # transformers' path: logits = x W^T (bf16), F.cross_entropy on fp32 logits, autograd backward.
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(V, H, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_(True)
    labels = torch.randint(0, V, (T,), device="cuda")

    def step():
        loss = F.cross_entropy(F.linear(x, w).float(), labels)
        loss.backward()
    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    row(f"loss head T{T} H{H} V{V} unfused fwd+bwd", median_ms(step, reps), 6.0 * T * V * H, "loss_head.unfused",
        peak_extra_bytes=peak)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seqs", default="4096,8192")
    ap.add_argument("--json", default="", help="write the rows (with moetrain bench's keys) to this file")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    steps = [lambda: bench_gemm(a.tokens, a.reps)]
    steps += [lambda T=int(s): bench_attention(T, a.reps, "full" if T == a.tokens else f"full{T}")
              for s in a.seqs.split(",")]
    steps.append(lambda: bench_loss_head(a.tokens, a.reps))
    for st in steps:  # one failing case does not lose the others
        try:
            st()
        except Exception as e:  # noqa: BLE001
            print(f"torch case failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        if a.json:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "tokens": a.tokens,
                       "rows": ROWS}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
