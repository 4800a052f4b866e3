#!/usr/bin/env bash
# The GPU proof script tests/gpu/plan_check.sh, run on the CPU with tiny presets: the planner's
# per-category peaks (moetrain plan --json) must equal the allocator's (metrics.jsonl) to the byte
# for six runs (MoE and dense, recompute none/selective/full; three steps each, so anything a step
# leaves allocated into the next shows); $1 = moetrain binary.
set -euo pipefail
MT=$(realpath "${1:?usage: plan_check_cpu.sh MOETRAIN_BINARY}")
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
OUT=$OUT PLAN_CHECK_DEVICE=cpu bash "$root/tests/gpu/plan_check.sh" "$MT" > "$OUT/log.txt" 2>&1 || { cat "$OUT/log.txt"; exit 1; }
grep -q "equal to the byte" "$OUT/plan_check.md" || { cat "$OUT/log.txt"; exit 1; }
rows=$(grep -c '^| .* | total |' "$OUT/plan_check.md")
[ "$rows" -eq 6 ] || { echo "expected 6 runs in the table, got $rows"; cat "$OUT/plan_check.md"; exit 1; }
echo "plan_check (cpu): 6 runs, every category equal to the byte"
