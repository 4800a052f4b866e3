#!/usr/bin/env python3
# torch._grouped_mm timings at the shapes of bench/standalone/gemm_bench.cu (T 4096 x top-8 = 32768
# routed rows, 128 experts, random routing): forward, dx and dW (bf16 output; f32 += as grouped_mm then
# add_), median of CUDA events.
import statistics
import sys

import torch


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    T, k, E = 4096, 8, 128
    N = T * k
    g = torch.Generator().manual_seed(42)
    picks = torch.rand(T, E, generator=g).argsort(dim=1)[:, :k]
    ends = torch.cumsum(torch.bincount(picks.flatten(), minlength=E), 0).to(torch.int32).cuda()
    for name, K, M in (("gate_up 2048->1536", 2048, 1536), ("down 768->2048", 768, 2048)):
        x = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(E, M, K, device="cuda", dtype=torch.bfloat16) * 0.02
        dy = torch.randn(N, M, device="cuda", dtype=torch.bfloat16)
        f = 2.0 * N * K * M
        wt = w.transpose(-2, -1)
        dyt = dy.t()
        gacc = torch.zeros(E, M, K, device="cuda", dtype=torch.float32)
        ops = [("fwd", lambda: torch._grouped_mm(x, wt, offs=ends)),
               ("dx", lambda: torch._grouped_mm(dy, w, offs=ends)),
               ("dw bf16 =", lambda: torch._grouped_mm(dyt, x, offs=ends)),
               ("dw f32 += (2op)", lambda: gacc.add_(torch._grouped_mm(dyt, x, offs=ends)))]
        try:  # f32 output, if this torch's grouped_mm takes out_dtype
            torch._grouped_mm(dyt, x, offs=ends, out_dtype=torch.float32)
            ops.append(("dw f32 =", lambda: torch._grouped_mm(dyt, x, offs=ends, out_dtype=torch.float32)))
        except Exception as e:  # noqa: BLE001
            print(f"(no f32 out_dtype: {type(e).__name__})")
        for op, fn in ops:
            ms = median_ms(fn, reps)
            print(f"| {name:<20} | {op:<14} | torch     | {ms:8.3f} | {f / ms / 1e9:6.0f} |", flush=True)
        del gacc


if __name__ == "__main__":
    main()
