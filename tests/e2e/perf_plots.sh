#!/usr/bin/env bash
# bench/perf_plots.py: the committed pictures docs/perf_layer_step.svg and docs/perf_ratio_by_round.svg
# are what its tables draw (--check), a fresh drawing into another folder is well-formed SVG with a
# bar for each part and a dot for each measurement, and --check fails (naming the file) on a stale
# picture. $1 (the moetrain binary) is not used.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py="$root/bench/perf_plots.py"
python3 "$py" --check
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$py" --out "$tmp" > /dev/null
python3 - "$tmp" "$root/bench" <<'PY'
import sys, xml.dom.minidom as md
d = sys.argv[1]
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[2])
import perf_plots as pp
layer = md.parse(f"{d}/perf_layer_step.svg").documentElement
bars = [r for r in layer.getElementsByTagName("rect") if r.getAttribute("fill") == "#3b7dd8"]
assert len(bars) == len(pp.LAYER_PARTS), f"perf_layer_step.svg: {len(bars)} bars for {len(pp.LAYER_PARTS)} parts"
ratio = md.parse(f"{d}/perf_ratio_by_round.svg").documentElement
dots = len(ratio.getElementsByTagName("circle"))
want = sum(len(v) for _, v in pp.RATIO_BY_ROUND)
assert dots == want, f"perf_ratio_by_round.svg: {dots} dots for {want} measurements"
PY
# A stale copy must fail the check and name itself.
cp -r "$root/bench" "$tmp/bench" && mkdir -p "$tmp/docs"
cp "$root/docs/perf_layer_step.svg" "$root/docs/perf_ratio_by_round.svg" "$tmp/docs/"
echo "<!-- edited -->" >> "$tmp/docs/perf_ratio_by_round.svg"
if python3 "$tmp/bench/perf_plots.py" --check 2> "$tmp/err.txt"; then
  echo "perf_plots.py --check passed a stale picture"; exit 1
fi
grep -q "perf_ratio_by_round.svg differs" "$tmp/err.txt" || { cat "$tmp/err.txt"; exit 1; }
echo "perf_plots: pictures current, well-formed, stale ones caught"
