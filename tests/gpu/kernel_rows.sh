#!/usr/bin/env bash
# kernel_rows.sh (on the GPU machine, from the repo root): the kernel microbenchmark rows as a
# distribution. A row moves by 5-10% from one process to the next (docs/performance.md, round 48), so
# each of ROUNDS rounds runs, in turn and each in a process of its own, `moetrain bench --kernels
# --no-steps` once per variant of VARIANTS and bench/torch_kernels.py once; then kernel_rows_table.py
# prints each key's median over the processes (and range) for every variant beside torch's, with the
# ratio torch / ours. Rounds 48-49 ran this by hand.
# Env: GPU_BIN (an unpacked tests/gpu/stage_perf.sh bundle: moetrain and lib/; or bundle.tar.xz's
# folder), OUT (/tmp/kernel-rows), ROUNDS (3), REPS (30), SEQ (4096), KERNEL_GROUPS (gmm), TORCH (1; 0
# skips torch), VARIANTS ("main"): space-separated NAME or NAME:VAR=V,VAR2=V2 (the environment of that
# variant's processes), e.g. VARIANTS="main old:MT_DW_TMA=0". EXTRA: more `moetrain bench` arguments.
# Logs and JSON in $OUT/rows; the table in $OUT/kernel_rows.txt (also printed).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/kernel-rows}
bin=${GPU_BIN:-$root/gpu-bin-perf}
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac
if [[ ! -x "$bin/moetrain" && -f "$bin/bundle.tar.xz" ]]; then
  mkdir -p /tmp/kernel-rows-bundle && tar -xJf "$bin/bundle.tar.xz" -C /tmp/kernel-rows-bundle && bin=/tmp/kernel-rows-bundle
fi
[[ -x "$bin/moetrain" ]] || { echo "kernel_rows.sh: no moetrain in $bin (GPU_BIN)" >&2; exit 2; }
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
rows=$out/rows
rm -rf "$rows" && mkdir -p "$rows"
seq_len=${SEQ:-4096}
for v in ${VARIANTS:-main}; do  # check every variant before the first run
  name=${v%%:*}
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "kernel_rows.sh: variant name '$name' (in '$v'): letters, digits, _ and - only" >&2; exit 2; }
done
rc=0
start=$(date +%s)
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in ${VARIANTS:-main}; do
    name=${v%%:*} envs=()
    [[ "$v" == *:* ]] && IFS=, read -r -a envs <<< "${v#*:}"
    # shellcheck disable=SC2086
    env "${envs[@]}" "$bin/moetrain" bench --kernels --no-steps --seq "$seq_len" --kernel-groups "${KERNEL_GROUPS:-gmm}" \
      --reps "${REPS:-30}" --json "$rows/ours.$name.$r.json" ${EXTRA:-} > "$rows/ours.$name.$r.log" 2>&1 \
      || { echo "kernel_rows.sh: round $r, $name failed (exit $?; $rows/ours.$name.$r.log)"; rc=1; }
  done
  if [[ "${TORCH:-1}" == 1 ]]; then
    python3 bench/torch_kernels.py --tokens "$seq_len" --seqs "$seq_len" --reps "${REPS:-30}" \
      --json "$rows/torch.$r.json" > "$rows/torch.$r.log" 2>&1 \
      || { echo "kernel_rows.sh: round $r, torch failed (exit $?; $rows/torch.$r.log)"; rc=1; }
  fi
  echo "kernel_rows.sh: round $r done after $(( $(date +%s) - start )) s"
done
names=()
for v in ${VARIANTS:-main}; do names+=("${v%%:*}"); done
python3 tests/gpu/kernel_rows_table.py "$rows" "${names[@]}" > "$out/kernel_rows.txt" || rc=1
cat "$out/kernel_rows.txt"
exit $rc
