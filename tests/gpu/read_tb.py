#!/usr/bin/env python3
# read_tb.py DIR: loads moetrain's TensorBoard event files with the tensorboard package's
# EventAccumulator (what TensorBoard and W&B's TensorBoard sync use) and prints every scalar tag
# with its step range and last value; the last line is a one-line summary. Exit 1 if none is found.
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags().get("scalars", [])
for t in sorted(tags):
    ev = acc.Scalars(t)
    print(f"{t:<36} {len(ev):4d} points, steps {ev[0].step}..{ev[-1].step}, last {ev[-1].value:.6g}")
loss = acc.Scalars("train/loss") if "train/loss" in tags else []
print(f"{len(tags)} scalar tags; train/loss {len(loss)} points"
      + (f" steps {loss[0].step}..{loss[-1].step}" if loss else ""))
sys.exit(0 if tags else 1)
