#!/usr/bin/env python3
# The table of tests/gpu/kernel_rows.sh: reads DIR/ours.<variant>.<round>.json (moetrain bench --json) and
# DIR/torch.<round>.json (bench/torch_kernels.py --json), and prints, for every kernel key, each variant's
# median ms over its processes with the range and the process count, torch's the same, and torch / ours
# for each variant (above 1: ours faster). Usage: kernel_rows_table.py DIR [VARIANT ...]: the variants'
# column order (default: sorted; any others found follow). Keys in the order of the first ours file.
# Exit 1 when DIR holds no ours file.
import glob
import json
import os
import re
import statistics
import sys


def rows_of(path):
    j = json.load(open(path))
    rows = j.get("kernels", j.get("rows", []))
    # every row with a key, 0 ms included (a difference row such as dx = (dx + dW) - dW is clamped at 0)
    return [(r["key"], r["ms"]) for r in rows if r.get("key") and r.get("ms") is not None]


def main():
    d = sys.argv[1]
    ours, order, variants = {}, [], list(sys.argv[2:])
    for f in sorted(glob.glob(os.path.join(d, "ours.*.json"))):
        m = re.match(r"ours\.(.+)\.(\d+)\.json$", os.path.basename(f))
        if not m:
            continue
        v = m.group(1)
        if v not in variants:
            variants.append(v)
        for k, ms in rows_of(f):
            ours.setdefault(v, {}).setdefault(k, []).append(ms)
            if k not in order:
                order.append(k)
    variants = [v for v in variants if v in ours]
    if not variants:
        print(f"kernel_rows_table.py: no ours.<variant>.<round>.json in {d}", file=sys.stderr)
        return 1
    torch = {}
    for f in sorted(glob.glob(os.path.join(d, "torch.*.json"))):
        for k, ms in rows_of(f):
            torch.setdefault(k, []).append(ms)

    def cell(xs):
        if not xs:
            return "-"
        return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}, n {len(xs)})"

    head = ["key"] + variants + ["torch"] + [f"torch / {v}" for v in variants]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for k in order:
        t = torch.get(k, [])
        line = [k] + [cell(ours[v].get(k, [])) for v in variants] + [cell(t)]
        for v in variants:
            o = ours[v].get(k, [])
            line.append(f"{statistics.median(t) / statistics.median(o):.3f}" if o and t and statistics.median(o) > 0
                        else "-")
        print("| " + " | ".join(line) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
