#!/usr/bin/env python3
"""Where the GPU idles inside a step: reads `nsys stats -r cuda_gpu_trace -f csv` output (tests/gpu/timeline.sh)
and prints, per step (averaged over the last --steps steps): the step's span, the kernels' busy time, the idle
time between consecutive GPU activities, the largest idle transitions (previous -> next kernel) and the kernels
by total time. Steps are split at host gaps longer than --split-us. --json also writes the per-step totals and every
kernel's time and count per step (tests/gpu/trace_ab.sh compares builds with it). --ordinal REGEX splits the kernels
whose name matches by launch, "name#i" for the i-th launch of that name in the step: `--ordinal gmm_ws_kernel` lists
each of a step's expert y / dx GEMM launches apart, in launch order (16 in a 4-layer step)."""
import argparse
import collections
import csv
import json
import re
import sys


def short(name):
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    name = re.split(r"[<(]", name, maxsplit=1)[0]
    name = name.replace("moetrain::cuda::", "").replace("flash::", "")
    return name[:60]


def number_launches(step, pattern):
    """The step's events with name#i for the i-th launch of each name matching `pattern`."""
    seen = collections.Counter()
    out = []
    for s, e, n in step:
        if pattern.search(n):
            i = seen[n]
            seen[n] += 1
            n = f"{n}#{i}"
        out.append((s, e, n))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--split-us", type=float, default=2000.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="write the per-step totals and each kernel's us and count per step here")
    ap.add_argument("--ordinal", help="regex: number the launches of matching kernels within each step (name#i)")
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        r = csv.DictReader(f)
        cols = r.fieldnames
        cs = next(c for c in cols if c.startswith("Start"))
        cd = next(c for c in cols if c.startswith("Duration"))
        cn = next(c for c in cols if c == "Name")
        for row in r:
            try:
                s, d = float(row[cs]), float(row[cd])
            except ValueError:
                continue
            rows.append((s, s + d, short(row[cn])))
    rows.sort()
    starts = [i for i, r in enumerate(rows) if r[2].startswith("embedding_fwd")]
    if starts:  # a moetrain step opens with the embedding lookup and ends before the next step's host gap
        segs = []
        for lo, hi in zip(starts, starts[1:] + [len(rows)]):
            seg = rows[lo:hi]
            ends = [j for j, r in enumerate(seg) if r[2].startswith("adamw")]
            segs.append(seg[: ends[-1] + 1] if ends else seg)
    else:
        segs, cur = [], []
        for ev in rows:
            if cur and ev[0] - max(e for _, e, _ in cur[-8:]) > a.split_us * 1e3:
                segs.append(cur)
                cur = []
            cur.append(ev)
        if cur:
            segs.append(cur)
    counts = collections.Counter(len(s) for s in segs if len(s) > 20)
    if not counts:
        print("timeline_gaps: no steps found")
        return 1
    mode = counts.most_common(1)[0][0]
    steps = [s for s in segs if len(s) == mode][-a.steps:]
    if a.ordinal:
        pat = re.compile(a.ordinal)
        steps = [number_launches(st, pat) for st in steps]
    print(f"{len(segs)} segments; {len(steps)} steps of {mode} GPU activities kept (layers {a.layers})")
    gap_by = collections.defaultdict(float)
    gap_n = collections.Counter()
    busy_by = collections.defaultdict(float)
    busy_n = collections.Counter()
    span = busy = idle = 0.0
    for st in steps:
        span += (max(e for _, e, _ in st) - st[0][0]) / 1e3
        end = st[0][1]
        prev = st[0][2]
        busy_by[prev] += (st[0][1] - st[0][0]) / 1e3
        busy_n[prev] += 1
        for s, e, n in st[1:]:
            g = (s - end) / 1e3
            if g > 0:
                idle += g
                gap_by[(prev, n)] += g
                gap_n[(prev, n)] += 1
            busy_by[n] += (e - s) / 1e3
            busy_n[n] += 1
            if e > end:
                end, prev = e, n
    k = len(steps)
    busy = sum(busy_by.values())
    print(f"per step: span {span / k:.1f} us, kernel time {busy / k:.1f} us, idle between activities {idle / k:.1f} us "
          f"({100 * idle / span:.2f}% of the span), {mode} activities")
    print(f"\nlargest idle transitions (us per step, count per step, mean us):")
    for (p, n), g in sorted(gap_by.items(), key=lambda x: -x[1])[: a.top]:
        c = gap_n[(p, n)] / k
        print(f"  {g / k:8.1f}  x{c:5.1f}  {g / k / c:6.2f}  {p} -> {n}")
    print(f"\nkernels by time (us per step, count per step, mean us):")
    for n, t in sorted(busy_by.items(), key=lambda x: -x[1])[: a.top + 10]:
        c = busy_n[n] / k
        print(f"  {t / k:9.1f}  x{c:5.1f}  {t / k / c:8.2f}  {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": k, "activities": mode, "span_us": span / k, "busy_us": busy / k, "idle_us": idle / k,
                       "kernels": {n: {"us": t / k, "count": busy_n[n] / k} for n, t in busy_by.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
