#!/usr/bin/env bash
# tests/gpu/kernel_rows.sh and kernel_rows_table.py, driven by the CPU build (tiny-moe, seq 64, the gmm
# rows, torch skipped): two variants over two rounds give a table with every key of the JSON, in the
# variants' order, each variant's median and range over its two processes; torch rows added by hand give
# torch / ours as their medians' ratio; a bad variant name and a missing binary stop before any run, and a
# failing run sets the exit status. $1 = moetrain binary.
set -euo pipefail
MT=$(realpath "${1:?usage: kernel_rows.sh MOETRAIN_BINARY}")
root=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/bin"
ln -s "$MT" "$W/bin/moetrain"
run() {  # run <out dir> <variants> [extra bench arguments]: kernel_rows.sh on the CPU binary
  GPU_BIN="$W/bin" OUT="$1" ROUNDS=2 REPS=1 SEQ=64 TORCH=0 VARIANTS="$2" \
    EXTRA="--model tiny-moe --device cpu ${3:-}" bash "$root/tests/gpu/kernel_rows.sh"
}
run "$W/a" "zeta alpha:MT_DW_TMA=1,MT_DW_DEEP=1" > "$W/a.txt" 2>&1 || { echo "kernel_rows.sh failed"; cat "$W/a.txt"; exit 1; }
# torch's rows for one key, two processes: medians 3.0 ms
printf '{"rows": [{"key": "gmm.gate_up.fwd", "ms": 2.0}]}' > "$W/a/rows/torch.1.json"
printf '{"rows": [{"key": "gmm.gate_up.fwd", "ms": 4.0}, {"key": "not.ours", "ms": 1.0}]}' > "$W/a/rows/torch.2.json"
python3 "$root/tests/gpu/kernel_rows_table.py" "$W/a/rows" zeta alpha > "$W/t.txt"
python3 - "$W/a" "$W/t.txt" <<'PY'
import json, statistics, sys
d, table = sys.argv[1], open(sys.argv[2]).read().splitlines()
fails = []
def check(c, what):
    if not c:
        fails.append(what)
first = open(f"{d}/kernel_rows.txt").read().splitlines()
check(first[0] == "| key | zeta | alpha | torch | torch / zeta | torch / alpha |", f"header {first[0]}")
keys = [r["key"] for r in json.load(open(f"{d}/rows/ours.zeta.1.json"))["kernels"]]
check(len(keys) >= 10 and keys[0] == "gmm.gate_up.fwd", f"keys {keys}")
lines = {l.split(" | ")[0][2:]: l for l in table[2:]}
check(list(lines) == keys, f"table keys {list(lines)}")
for v, col in (("zeta", 1), ("alpha", 2)):
    ms = {k: [] for k in keys}
    for r in (1, 2):
        for row in json.load(open(f"{d}/rows/ours.{v}.{r}.json"))["kernels"]:
            ms[row["key"]].append(row["ms"])
    for k in keys:
        cell = lines[k].strip("| ").split(" | ")[col]
        xs = ms[k]
        want = f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}, n {len(xs)})" if xs else "-"
        check(cell == want, f"{v} {k}: {cell} != {want}")
g = lines["gmm.gate_up.fwd"].strip("| ").split(" | ")
check(g[3] == "3.000 (2.000-4.000, n 2)", f"torch cell {g[3]}")
for v, col in (("zeta", 1), ("alpha", 2)):
    o = statistics.median([r["ms"] for f in (1, 2) for r in json.load(open(f"{d}/rows/ours.{v}.{f}.json"))["kernels"]
                           if r["key"] == "gmm.gate_up.fwd"])
    check(g[3 + col] == f"{3.0 / o:.3f}", f"ratio {v}: {g[3 + col]} != {3.0 / o:.3f}")
check(lines["gmm.down.fwd"].rstrip(" |").endswith("- | - | -"), "no torch row: dashes")
check("not.ours" not in lines, "torch-only keys are not listed")
if fails:
    print("kernel_rows.sh FAILED:\n  " + "\n  ".join(fails))
    sys.exit(1)
PY
# bad input: stops before any run, with one clear line and exit 2
if run "$W/b" "ok bad.name:X=1" > "$W/b.txt" 2>&1; then echo "a bad variant name passed"; exit 1; fi
grep -q "variant name 'bad.name'" "$W/b.txt" || { echo "no message for a bad variant name"; cat "$W/b.txt"; exit 1; }
[[ ! -e "$W/b/rows/ours.ok.1.json" ]] || { echo "ran before checking the variants"; exit 1; }
if GPU_BIN="$W/none" OUT="$W/c" bash "$root/tests/gpu/kernel_rows.sh" > "$W/c.txt" 2>&1; then echo "no binary passed"; exit 1; fi
grep -q "no moetrain in $W/none" "$W/c.txt" || { echo "no message for a missing binary"; cat "$W/c.txt"; exit 1; }
# a failing run: exit status 1, its log named
if run "$W/d" "main" "--no-such-option" > "$W/d.txt" 2>&1; then echo "a failing run passed"; exit 1; fi
grep -q "round 1, main failed" "$W/d.txt" || { echo "no message for a failing run"; cat "$W/d.txt"; exit 1; }
echo "kernel_rows.sh: ok"
