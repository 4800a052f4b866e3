#!/usr/bin/env bash
# trace_ab.sh (on the GPU machine, from the repo root): do two or more builds differ kernel by kernel?
# Runs tests/gpu/timeline.sh (the step's kernel trace) for each bundle in BUNDLES, alternating, ROUNDS
# times, and prints each kernel's GPU time per step for every run, with the change of each bundle's
# mean against the first bundle's. Kernel times move by about 1% between runs, where a step's time
# moves by 5% at the power cap (round 27), so this resolves changes a same-call pair cannot.
# Env: BUNDLES (stage_perf.sh bundle directories, space separated, required), VARIANTS ("name:K=V,K=V name2:":
# one bundle run under each environment instead, e.g. "base: deep:MT_DW_ADAMW_VARIANT=4"), ROUNDS (2), LAYERS (4), SEQ,
# MT_BENCH_SET (as timeline.sh; default the all-bf16 keys with the update in backward), MATCH (regex:
# list only matching kernels), TOP (25: the kernels with the largest changes). The table also gives each
# kernel's launches per step (calls) for the first bundle, marked * where another bundle differs.
# GAPS_ARGS (timeline_gaps.py options, e.g. "--ordinal gmm_ws_kernel": each launch of a kernel apart).
# Results: $OUT/trace_ab/<bundle>.r<round>/ (timeline.sh's), $OUT/trace_ab/table.txt (printed last).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}/trace_ab
mkdir -p "$out"
export MT_BENCH_SET=${MT_BENCH_SET:-"optimizer.main_grads_dtype=bf16 optimizer.main_params_dtype=bf16 optimizer.exp_avg_dtype=bf16 optimizer.exp_avg_sq_dtype=bf16 optimizer.clip_grad=0 optimizer.update_in_backward=true"}
bundles=(${BUNDLES:?BUNDLES: bundle directories, e.g. \"gpu-bin-head gpu-bin-new\"})
# VARIANTS ("name:K=V,K=V name2:"): one bundle under several environments instead of several bundles
variants=(${VARIANTS:-})
if (( ${#variants[@]} )); then
  (( ${#bundles[@]} == 1 )) || { echo "trace_ab: VARIANTS takes one bundle in BUNDLES" >&2; exit 2; }
  names=()
  for v in "${variants[@]}"; do names+=("${v%%:*}"); done
else
  names=("${bundles[@]}")
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  for i in "${!names[@]}"; do
    b=${bundles[0]} envs=()
    if (( ${#variants[@]} )); then
      kv=${variants[$i]#*:}
      [[ -n "$kv" ]] && IFS=, read -ra envs <<< "$kv"
    else
      b=${bundles[$i]}
    fi
    d=$out/$(basename "${names[$i]}").r$r
    env "${envs[@]}" OUT=$d GPU_BIN=$b LAYERS=${LAYERS:-4} bash tests/gpu/timeline.sh > /dev/null 2>&1
    rm -f "$d/trace.csv.xz"
    echo "$(basename "${names[$i]}") round $r: $(grep -m1 '^per step' "$d/timeline.txt" 2>/dev/null || echo 'no trace')"
  done
done
python3 - "$out" "${ROUNDS:-2}" "${MATCH:-}" "${TOP:-25}" "${names[@]}" <<'PY' | tee "$out/table.txt"
import json, os, re, statistics, sys
out, rounds, match, top, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5:]
names = [os.path.basename(n.rstrip("/")) for n in names]
runs = {n: [] for n in names}
for n in names:
    for r in range(1, rounds + 1):
        p = f"{out}/{n}.r{r}/kernels.json"
        if os.path.exists(p):
            runs[n].append(json.load(open(p)))
if any(not v for v in runs.values()):
    sys.exit("trace_ab: a bundle has no trace: " + " ".join(n for n, v in runs.items() if not v))
def col(n, key):
    return [r["kernels"].get(key, {"us": 0.0})["us"] for r in runs[n]]
def calls(n, key):  # launches per step (mean over runs; 0 where the bundle has none)
    return statistics.mean(r["kernels"].get(key, {}).get("count", 0.0) for r in runs[n])
kernels = set().union(*(r["kernels"] for v in runs.values() for r in v))
if match:
    kernels = {k for k in kernels if re.search(match, k)}
base = names[0]
rows = []
for k in kernels:
    mb = statistics.mean(col(base, k))
    moves = [statistics.mean(col(n, k)) - mb for n in names[1:]]
    rows.append((max((abs(m) for m in moves), default=0.0), k, moves))
rows.sort(reverse=True)
print(f"us per step ({rounds} runs per bundle, alternating); change = mean - mean of {base}")
for n in names:
    tot = [r["busy_us"] for r in runs[n]]
    idle = [r["idle_us"] for r in runs[n]]
    print(f"  {n}: kernel time {' '.join(f'{x:.1f}' for x in tot)}; idle {' '.join(f'{x:.1f}' for x in idle)}")
# calls: the first bundle's launches per step, "*" where another bundle's differ (then the per-call
# times are not comparable)
hdr = f"{'kernel':<52}{'calls':>7}" + "".join(f"{n[:24]:>26}" for n in names) + \
      "".join(f"{'chg ' + n[:12]:>18}" for n in names[1:])
print(hdr)
for _, k, moves in rows[:top]:
    c = calls(base, k)
    mark = "*" if any(abs(calls(n, k) - c) > 1e-9 for n in names[1:]) else ""
    cells = "".join(f"{' '.join(f'{x:.1f}' for x in col(n, k)):>26}" for n in names)
    print(f"{k[:52]:<52}{f'{c:g}{mark}':>7}{cells}" + "".join(f"{m:>+18.1f}" for m in moves))
PY
