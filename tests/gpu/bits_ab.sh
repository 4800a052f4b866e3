#!/usr/bin/env bash
# bits_ab.sh (on the GPU machine, from the repo root): do two or more builds train the same bits?
# Runs 4 steps of the 2-layer Qwen3-30B-A3B proxy (tests/gpu/proxy.yaml, mock data, all-bf16 with the
# update in backward unless MT_BENCH_SET says otherwise) once per bundle in BUNDLES (stage_perf.sh
# bundle directories, space separated; a name may repeat, to show that one build repeats itself) and
# compares each run's printed losses and gradient norms (repr of the JSON doubles) with the first run's.
# A kernel change that claims the same arithmetic must print "equal". Logs and the values in $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/moetrain-gpu-out}
mkdir -p "$out"
sets=${MT_BENCH_SET:-"optimizer.main_grads_dtype=bf16 optimizer.main_params_dtype=bf16 optimizer.exp_avg_dtype=bf16 optimizer.exp_avg_sq_dtype=bf16 optimizer.clip_grad=0 optimizer.update_in_backward=true"}
i=0 differ=0
for b in ${BUNDLES:?BUNDLES: bundle directories, e.g. \"gpu-bin-head gpu-bin-new\"}; do
  i=$((i + 1))
  d=/tmp/bits_ab_$(basename "$b")
  [[ -x "$d/moetrain" ]] || { mkdir -p "$d" && tar -xJf "$b/bundle.tar.xz" -C "$d"; } || exit 1
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH="$d/lib:/usr/local/cuda/lib64" timeout 150 "$d/moetrain" train tests/gpu/proxy.yaml \
    model.num_layers=2 training.train_iters=4 logging.run_dir="/tmp/bits_ab_run$i" $sets > "$out/bits_train$i.log" 2>&1
  rc=$?
  python3 -c "
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if 'loss' in d: print(d.get('step'), repr(d.get('loss')), repr(d.get('grad_norm')))
" "/tmp/bits_ab_run$i/metrics.jsonl" > "$out/bits_values$i.txt" 2>/dev/null
  verdict=equal
  cmp -s "$out/bits_values1.txt" "$out/bits_values$i.txt" || { verdict=DIFFERS; differ=1; }
  [[ -s "$out/bits_values$i.txt" ]] || { verdict="no values (exit $rc)"; differ=1; }
  echo "run $i $b (exit $rc): $verdict | $(tr '\n' ' ' < "$out/bits_values$i.txt")"
done
exit $differ
