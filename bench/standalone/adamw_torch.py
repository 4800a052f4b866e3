# torch.optim.AdamW(fused=True) step time on bf16 parameters (the PyTorch anchor's optimizer) over
# the 604M expert parameters of one Qwen3-30B-A3B layer, split like the anchor's fused expert
# tensors (gate_up [128,1536,2048], down [128,2048,768]); median of 10 after 3 warm-ups.
import torch

params = [torch.randn(128, 1536, 2048, device="cuda", dtype=torch.bfloat16) * 0.02,
          torch.randn(128, 2048, 768, device="cuda", dtype=torch.bfloat16) * 0.02]
params = [torch.nn.Parameter(p) for p in params]
for p in params:
    p.grad = torch.randn_like(p)
opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
for _ in range(3):
    opt.step()
times = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); opt.step(); b.record(); torch.cuda.synchronize()
    times.append(a.elapsed_time(b))
times.sort()
n = sum(p.numel() for p in params)
ms = 0.5 * (times[4] + times[5])
print(f"| torch AdamW fused, bf16 params/grads/m/v ({n} elements) | 14 | {ms:.3f} | {14 * n / ms / 1e6:.0f} | - |")
