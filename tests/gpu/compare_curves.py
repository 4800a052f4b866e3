#!/usr/bin/env python3
# compare_curves.py GPU_METRICS CPU_METRICS [SVG]: compares two training runs' loss curves
# (metrics.jsonl of moetrain train) step by step and writes both curves into one SVG (stdlib only).
# Last line: steps compared, mean and max |dloss|, mean |dloss| over the last 50 steps, final losses.
import json
import sys


def losses(path, kind="train"):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == kind:
            out[r["step"]] = r["loss"]
    return out


def svg(curves, path, title):
    W, H, m = 760, 420, 50
    pts = [v for c in curves for v in c[1].values()]
    steps = [s for c in curves for s in c[1]]
    x0, x1, y0, y1 = min(steps), max(steps), min(pts), max(pts)
    sx = lambda s: m + (s - x0) / max(x1 - x0, 1) * (W - 2 * m)
    sy = lambda v: H - m - (v - y0) / max(y1 - y0, 1e-9) * (H - 2 * m)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W/2}" y="20" text-anchor="middle">{title}</text>',
         f'<line x1="{m}" y1="{H-m}" x2="{W-m}" y2="{H-m}" stroke="black"/>',
         f'<line x1="{m}" y1="{m}" x2="{m}" y2="{H-m}" stroke="black"/>']
    for i in range(6):
        v = y0 + (y1 - y0) * i / 5
        s = x0 + (x1 - x0) * i / 5
        o.append(f'<text x="{m-5}" y="{sy(v)+4:.1f}" text-anchor="end">{v:.2f}</text>')
        o.append(f'<text x="{sx(s):.1f}" y="{H-m+16}" text-anchor="middle">{s:.0f}</text>')
    o.append(f'<text x="{W/2}" y="{H-8}" text-anchor="middle">step</text>')
    for i, (name, c, color) in enumerate(curves):
        p = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in sorted(c.items()))
        o.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{p}"/>')
        o.append(f'<text x="{W-m-200}" y="{m+16*i}" fill="{color}">{name}</text>')
    o.append("</svg>")
    open(path, "w").write("\n".join(o))


g, c = losses(sys.argv[1]), losses(sys.argv[2])
common = sorted(set(g) & set(c))
d = [abs(g[s] - c[s]) for s in common]
last = [abs(g[s] - c[s]) for s in common[-50:]]
if len(sys.argv) > 3:
    svg([("GPU bf16 (train loss)", g, "#d62728"), ("CPU f32 (train loss)", c, "#1f77b4")], sys.argv[3],
        "demo-moe SFT, seq 128, 200 steps: GPU bf16 vs CPU f32")
gv, cv = losses(sys.argv[1], "valid"), losses(sys.argv[2], "valid")
for s in sorted(set(gv) & set(cv)):
    print(f"valid step {s}: gpu {gv[s]:.4f} cpu {cv[s]:.4f} diff {gv[s]-cv[s]:+.4f}")
if common:
    print(f"{len(common)} steps: mean |dloss| {sum(d)/len(d):.4f}, max {max(d):.4f}, last-50 mean {sum(last)/len(last):.4f}; "
          f"final gpu {g[common[-1]]:.4f} cpu {c[common[-1]]:.4f}")
else:
    print(f"no common steps (gpu {len(g)}, cpu {len(c)})")
