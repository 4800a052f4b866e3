#!/usr/bin/env bash
# profile.sh (on the GPU machine, from the repo root): per-op profile of the Qwen3-30B-A3B depth
# proxies. Runs `moetrain train tests/gpu/proxy.yaml` at each depth in LAYERS (default "2 4") with
# MT_PROFILE=1, then prints each run's per-op table (ms per step, warm-up included) and the median
# step time. Optional: TEST_BACKEND=1 runs test_backend first (GroupedMatmul's slow CPU case left
# out); EXTRA holds more overrides. Needs the bundle of stage_session.sh (GPU_BIN). Logs to $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}
mkdir -p "$out"
bin=${GPU_BIN:-$root/gpu-bin-lead}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p /tmp/prof-bundle && tar -xJf "$bin/bundle.tar.xz" -C /tmp/prof-bundle && bin=/tmp/prof-bundle
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if [[ "${TEST_BACKEND:-0}" == 1 ]]; then
  timeout 200 "$bin/test_backend" --gtest_color=no --gtest_filter=-Backend.GroupedMatmul > "$out/test_backend.log" 2>&1
  echo "test_backend exit $?: $(grep -E '^\[ +(PASSED|FAILED)' "$out/test_backend.log" | tr -s ' ' | head -5)"
  grep -E '^backend table:' -A40 "$out/test_backend.log" | tail -40
fi
for L in ${LAYERS:-2 4}; do
  rd=/tmp/prof-runs/L$L
  rm -rf "$rd"
  MT_PROFILE=1 timeout 240 "$bin/moetrain" train tests/gpu/proxy.yaml model.num_layers=$L training.train_iters=${STEPS:-8} \
    logging.run_dir="$rd" ${EXTRA:-} > "$out/proxy_L$L.log" 2>&1
  echo "== L=$L exit $?"
  python3 - "$rd/metrics.jsonl" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
ts = [r["step_time_s"] * 1e3 for r in recs if r["step"] >= 3]
peak = max(r["memory"]["total"]["peak"] for r in recs) / 2**30
print(f"median step {statistics.median(ts):.2f} ms over {len(ts)} steps; peak {peak:.1f} GiB")
PY
  grep "^\[profile\]" "$out/proxy_L$L.log" | sed 's/^\[profile\] //' | head -45
done
