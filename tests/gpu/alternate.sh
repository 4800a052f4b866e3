#!/usr/bin/env bash
# alternate.sh (on the GPU machine, from the repo root): moetrain's layer step and torch.compile's,
# alternating in one call, so that the ratio comes from medians of several runs of each rather than
# from one pair (one binary read 6.8-7.6 ms/layer from run to run at the 700 W cap; round 27).
# Each round runs `moetrain bench --layers 2,4` then torch_anchor.py (IMPLS=grouped_mm+compile) at
# SEQ / MBS. nvidia-smi dmon samples power, temperature and clocks every second beside them.
# Env: GPU_BIN (bundle of stage_perf.sh, default gpu-bin-perf), ROUNDS (2), SEQ (4096), MBS (1),
# MT_BENCH_SET ("k=v k=v" --set overrides for moetrain), MT_BENCH_SET_B (more overrides: each round then also
# runs moetrain with MT_BENCH_SET plus these, as configuration B), MT_ENV_B ("K=V K=V": environment of the
# B runs, alone or with MT_BENCH_SET_B, e.g. a kernel switch), IDLE_S (0: seconds of idle between rounds).
# Results: $OUT/alternate/ (logs, JSON, dmon.txt, table.txt); the table is printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}/alternate
mkdir -p "$out"
bin=${GPU_BIN:-gpu-bin-perf}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p /tmp/alternate_bundle && tar -xJf "$bin/bundle.tar.xz" -C /tmp/alternate_bundle && bin=/tmp/alternate_bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
anchor=$bin/torch_anchor.py
[[ -f "$anchor" ]] || anchor=$root/../shared/bench/torch_anchor.py
seq=${SEQ:-4096} mbs=${MBS:-1}
sets=()
for s in ${MT_BENCH_SET:-}; do sets+=(--set "$s"); done
nvidia-smi dmon -s pct -o T > "$out/dmon.txt" 2>&1 &
dmon=$!
trap 'kill $dmon 2>/dev/null' EXIT
ours=() torch=() ours_b=()
sets_b=()
for s in ${MT_BENCH_SET_B:-}; do sets_b+=(--set "$s"); done
for r in $(seq 1 "${ROUNDS:-2}"); do
  timeout 170 "$bin/moetrain" bench --layers 2,4 --seq "$seq" --mbs "$mbs" "${sets[@]}" \
    --json "$out/ours.r$r.json" > "$out/ours.r$r.log" 2>&1
  o=$(grep -o 'per layer [0-9.]* ms' "$out/ours.r$r.log" | awk '{print $3}')
  ob=
  if [[ -n "${MT_BENCH_SET_B:-}${MT_ENV_B:-}" ]]; then
    # shellcheck disable=SC2086
    env ${MT_ENV_B:-} timeout 170 "$bin/moetrain" bench --layers 2,4 --seq "$seq" --mbs "$mbs" "${sets[@]}" "${sets_b[@]}" \
      --json "$out/ours_b.r$r.json" > "$out/ours_b.r$r.log" 2>&1
    ob=$(grep -o 'per layer [0-9.]* ms' "$out/ours_b.r$r.log" | awk '{print $3}')
    [[ -n "$ob" ]] && ours_b+=("$ob")
  fi
  mkdir -p "$out/torch.r$r"
  OUT="$out/torch.r$r" IMPLS=grouped_mm+compile SEQ=$seq MBS=$mbs timeout 300 python3 "$anchor" \
    > "$out/torch.r$r.log" 2>&1
  t=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['grouped_mm+compile']['per_layer_ms'])" \
    "$out/torch.r$r/torch_anchor.json" 2>/dev/null)
  b_on=${MT_BENCH_SET_B:-}${MT_ENV_B:-}
  echo "round $r: ours ${o:-?} ms/layer${b_on:+, ours (B) ${ob:-?}}, torch.compile ${t:-?} ms/layer"
  [[ -n "$o" ]] && ours+=("$o")
  [[ -n "$t" ]] && torch+=("$t")
  sleep "${IDLE_S:-0}"
done
python3 - "${#ours[@]}" "${#torch[@]}" "${ours[@]}" "${torch[@]}" "${ours_b[@]}" <<'PY' | tee "$out/table.txt"
import statistics, sys
n, nt = int(sys.argv[1]), int(sys.argv[2])
ours = [float(x) for x in sys.argv[3:3 + n]]
torch = [float(x) for x in sys.argv[3 + n:3 + n + nt]]
ours_b = [float(x) for x in sys.argv[3 + n + nt:]]
print(f"ours ms/layer:          {' '.join(f'{x:.3f}' for x in ours)}")
if ours_b:
    print(f"ours (B) ms/layer:      {' '.join(f'{x:.3f}' for x in ours_b)}")
print(f"torch.compile ms/layer: {' '.join(f'{x:.2f}' for x in torch)}")
if ours and torch:
    mo, mt = statistics.median(ours), statistics.median(torch)
    print(f"medians: ours {mo:.3f}, torch {mt:.2f}; ratio {mt / mo:.2f} (2x needs ours <= {mt / 2:.3f})")
    if ours_b:
        mb = statistics.median(ours_b)
        print(f"medians: ours (B) {mb:.3f}; ratio {mt / mb:.2f}")
PY
