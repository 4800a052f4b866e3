#!/usr/bin/env python3
# proxy_table.py METRICS_2L METRICS_4L: the PERF.md projection from the step times of the
# Qwen3-30B-A3B 2- and 4-layer proxies (seq 4096, mbs 1): median step time over steps 3.., per-layer
# = (t4 - t2) / 2, fixed = t2 - 2 * per-layer, 48-layer step = fixed + 48 * per-layer, tokens/s =
# tokens per step / that, model TFLOP/s at 23.1 GFLOP/token (SPEC.md section 10), MFU vs 989.
import json
import statistics
import sys


def load(path):
    recs = [json.loads(l) for l in open(path)]
    return [r for r in recs if r.get("type") == "train"]


res = {}
for L, p in ((2, sys.argv[1]), (4, sys.argv[2])):
    try:
        tr = load(p)
    except OSError:
        tr = []
    times = [r["step_time_s"] for r in tr if r["step"] >= 3] or [r["step_time_s"] for r in tr]
    if not times:
        print(f"{L} layers: no steps")
        continue
    t = statistics.median(times)
    peak = max(r["memory"]["total"]["peak"] for r in tr) / 2**30
    tok = tr[-1]["tokens"]
    res[L] = (t, tok)
    print(f"{L} layers: {len(tr)} steps, median {t*1e3:.1f} ms/step (steps {[round(x*1e3) for x in times]}), "
          f"peak {peak:.1f} GiB, loss {tr[0]['loss']:.3f}->{tr[-1]['loss']:.3f}")
if 2 in res and 4 in res:
    per = (res[4][0] - res[2][0]) / 2
    fixed = res[2][0] - 2 * per
    proj = fixed + 48 * per
    tps = res[2][1] / proj
    tfl = tps * 23.1e9 / 1e12
    print(f"per-layer {per*1e3:.1f} ms, fixed {fixed*1e3:.1f} ms, 48-layer {proj*1e3:.0f} ms/step, "
          f"{tps:,.0f} tokens/s/GPU, {tfl:.0f} model TFLOP/s, MFU {tfl/989:.1%}")
