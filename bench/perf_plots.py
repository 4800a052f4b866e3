#!/usr/bin/env python3
"""Draws issue 7's two pictures from the numbers recorded in docs/performance.md and
docs/design/kernels.md (standard library only, deterministic output):

  docs/perf_layer_step.svg      where one Qwen3-30B-A3B layer's training step goes on an H200,
                                part by part, against each part's computed floor
  docs/perf_ratio_by_round.svg  the headline ratio (torch.compile ms / moetrain ms a layer) of every
                                same-call measurement on the H200, by round, against the 2x target

Usage: python3 bench/perf_plots.py [--out DIR] [--check]
  --out DIR  write the two SVGs into DIR (default: docs/ of this checkout)
  --check    write nothing; exit 1 naming each SVG in docs/ that differs from what the data draws
When a round adds numbers, add them to the tables below (with the section they come from) and run
the script; tests/e2e/perf_plots.sh fails while the committed pictures lag the tables.
"""
import argparse
import os
import sys
import tempfile

# One layer's step, us: (part, measured low, measured high, floor or None, what the floor is).
# Round 43's kernel trace of the current default (docs/performance.md, "Issue 7, round 43", call 6:
# tests/gpu/trace_ab.sh, two runs, per-step kernels such as the loss head left out), all-bf16 keys,
# update in backward, seq 4096, mbs 1. Floors as in docs/design/kernels.md, "Where things stand".
LAYER_PARTS = [
    ("expert dW + fused AdamW walk", 2656, 2671, 1690, "floor: 7.25 GB at 4.3 TB/s"),
    ("expert GEMMs, forward and dx", 1192, 1200, 790, "floor: 0.62 TFLOP at 784 TFLOP/s"),
    ("attention backward", 727, 732, 490, "floor: 344 GFLOP at 700 TFLOP/s"),
    ("cuBLAS q|k|v, o, router GEMMs", 635, 642, None, "at the GEMM ceiling"),
    ("attention forward", 254, 259, 196, "floor: 137 GFLOP at 700 TFLOP/s"),
    ("norms, RoPE, gathers, SwiGLU, routing", 480, 482, None, "each near its bytes"),
]
BENCH_MS = 6.010  # moetrain bench, round 43's pooled median a layer (12 alternating runs)
TORCH_COMPILE_MS = 12.18  # round 43's pooled median, transformers grouped_mm + torch.compile

# Headline ratio of each same-call measurement on the H200 (docs/performance.md, "Where things stand").
RATIO_BY_ROUND = [
    (32, [1.84, 1.88, 1.85]),
    (33, [1.94]),
    (34, [1.93, 1.90]),
    (35, [1.90, 1.91]),
    (36, [1.94]),
    (37, [2.01, 1.98]),
    (38, [2.03, 2.08]),
    (39, [2.03, 1.96]),
    (40, [2.02]),
    (41, [1.97]),
    (42, [2.09]),
    (43, [1.97, 2.02, 2.00]),
    (44, [2.01]),
    (45, [2.14, 1.98]),
    (46, [1.97, 1.97]),
    (47, [2.02, 2.00, 2.02]),
    (48, [2.06, 1.97, 2.05, 1.99]),
    (49, [1.99]),
    (50, [2.17]),
    (51, [2.06, 1.94, 2.08, 2.08]),
    (52, [2.03]),
]

FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def text(x, y, s, size=12, anchor="start", color="#222", bold=False):
    weight = ' font-weight="bold"' if bold else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" '
            f'fill="{color}"{weight}>{esc(s)}</text>')


def head(w, h, title, subtitle):
    """The opening of a w x h picture: the svg element, a white ground, the title and its subtitle."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">',
            f'<rect width="{w}" height="{h}" fill="white"/>',
            text(w / 2, 24, title, 15, "middle", bold=True),
            text(w / 2, 44, subtitle, 11, "middle", "#555")]


def layer_step_svg():
    w, left, right, top, row = 860, 270, 150, 70, 34
    h = top + row * len(LAYER_PARTS) + 108
    span = w - left - right
    scale = span / 3000.0  # us across the plot
    out = head(w, h, "One Qwen3-30B-A3B layer's training step on one H200, part by part",
               "seq 4096, mbs 1, bf16 weights and AdamW state; bars: measured (two runs), "
               "marks: the part's computed floor")
    for us in range(0, 3001, 500):
        x = left + us * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 8}" x2="{x:.1f}" y2="{top + row * len(LAYER_PARTS)}" '
                   'stroke="#ddd" stroke-width="1"/>')
        out.append(text(x, top + row * len(LAYER_PARTS) + 16, f"{us}", 10, "middle", "#555"))
    out.append(text(left + span / 2, top + row * len(LAYER_PARTS) + 32, "microseconds a layer", 11, "middle",
                    "#555"))
    total_lo = total_hi = 0
    for i, (name, lo, hi, floor, _src) in enumerate(LAYER_PARTS):
        y = top + i * row
        total_lo += lo
        total_hi += hi
        out.append(text(left - 8, y + 17, name, 12, "end"))
        out.append(f'<rect x="{left}" y="{y + 5}" width="{lo * scale:.1f}" height="{row - 12}" fill="#3b7dd8"/>')
        out.append(f'<rect x="{left + lo * scale:.1f}" y="{y + 5}" width="{(hi - lo) * scale:.1f}" '
                   f'height="{row - 12}" fill="#9dbdec"/>')
        if floor is not None:
            fx = left + floor * scale
            out.append(f'<line x1="{fx:.1f}" y1="{y + 1}" x2="{fx:.1f}" y2="{y + row - 3}" stroke="#d13b3b" '
                       'stroke-width="3"/>')
            label = f"{lo}-{hi} us (floor {floor})"
        else:
            label = f"{lo}-{hi} us"
        out.append(text(left + hi * scale + 6, y + 17, label, 11, "start", "#333"))
    yb = top + row * len(LAYER_PARTS) + 60
    half = TORCH_COMPILE_MS / 2
    out.append(text(w / 2, yb, f"the kernels sum to {total_lo / 1000:.2f}-{total_hi / 1000:.2f} ms a layer; "
                    f"moetrain bench: {BENCH_MS:.2f} ms a layer", 12, "middle", bold=True))
    out.append(text(w / 2, yb + 18, f"transformers grouped_mm + torch.compile: {TORCH_COMPILE_MS:.2f} ms "
                    f"(2x needs at most {half:.2f})", 12, "middle", bold=True))
    out.append(text(w / 2, yb + 36, "source: docs/performance.md, round 43 (the kernel trace and the "
                    "alternating runs)", 10, "middle", "#777"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def ratio_svg():
    w, h, left, right, top, bottom = 760, 380, 70, 30, 60, 60
    lo_r, hi_r = 1.75, 2.15
    rounds = [r for r, _ in RATIO_BY_ROUND]
    r0, r1 = rounds[0] - 0.5, rounds[-1] + 0.5
    pw, ph = w - left - right, h - top - bottom

    def px(r):
        return left + (r - r0) / (r1 - r0) * pw

    def py(v):
        return top + (hi_r - v) / (hi_r - lo_r) * ph

    out = head(w, h, "Layer step speed against transformers + torch.compile, one H200, by round",
               "each dot: one same-call measurement (median of alternating runs); ratio = torch ms / moetrain ms")
    v = lo_r
    while v <= hi_r + 1e-9:
        y = py(v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(text(left - 8, y + 4, f"{v:.2f}", 10, "end", "#555"))
        v += 0.05
    y2 = py(2.0)
    out.append(f'<line x1="{left}" y1="{y2:.1f}" x2="{w - right}" y2="{y2:.1f}" stroke="#d13b3b" '
               'stroke-width="2" stroke-dasharray="6,4"/>')
    out.append(text(left + 6, y2 - 6, "target 2.0", 11, "start", "#d13b3b"))
    for r, vals in RATIO_BY_ROUND:
        x = px(r)
        out.append(text(x, h - bottom + 18, str(r), 10, "middle", "#555"))
        for j, val in enumerate(vals):
            dx = (j - (len(vals) - 1) / 2) * 7
            out.append(f'<circle cx="{x + dx:.1f}" cy="{py(val):.1f}" r="4.5" fill="#3b7dd8"/>')
    out.append(text(left + pw / 2, h - 14, "round (2026-11-28 to 2026-11-29)", 11, "middle", "#555"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    docs = os.path.join(os.path.dirname(here), "docs")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=docs)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    pictures = {"perf_layer_step.svg": layer_step_svg(), "perf_ratio_by_round.svg": ratio_svg()}
    if args.check:
        stale = []
        for name, svg in pictures.items():
            path = os.path.join(docs, name)
            try:
                with open(path, encoding="utf-8") as f:
                    same = f.read() == svg
            except OSError:
                same = False
            if not same:
                stale.append(path)
        for path in stale:
            print(f"perf_plots: {path} differs from the tables in bench/perf_plots.py "
                  "(run python3 bench/perf_plots.py)", file=sys.stderr)
        return 1 if stale else 0
    os.makedirs(args.out, exist_ok=True)
    for name, svg in pictures.items():
        # Written beside the target and renamed over it, so a kill never leaves half a picture.
        fd, tmp = tempfile.mkstemp(dir=args.out, prefix=f".{name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(svg)
        os.replace(tmp, os.path.join(args.out, name))
        print(os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
