#!/usr/bin/env bash
# docs/plan.md's worked answer (Qwen3-30B-A3B on 8x MI300X / 8x H100 / 4x H200 with three optimizers)
# must be what the planner says now: bench/plan_worked_answer.py's table against the one in the doc,
# line for line. A planner change that moves a number fails here until the table is regenerated
# (python3 bench/plan_worked_answer.py build/moetrain). $1 = moetrain binary.
set -euo pipefail
MT=$(realpath "${1:?usage: plan_worked_answer.sh MOETRAIN_BINARY}")
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$root/bench/plan_worked_answer.py" "$MT" > "$tmp/now.md"
# the doc's table: from its header line, as many lines as the planner's
awk -v n="$(wc -l < "$tmp/now.md")" '/^\| GPUs \| optimizer \|/ {on = 1} on && n-- > 0' "$root/docs/plan.md" > "$tmp/doc.md"
if ! diff -u "$tmp/doc.md" "$tmp/now.md"; then
  echo "docs/plan.md's worked-answer table is stale (above: - the doc, + the planner); regenerate it with"
  echo "  python3 bench/plan_worked_answer.py $MT"
  exit 1
fi
echo "plan_worked_answer: docs/plan.md's table equals the planner's ($(($(wc -l < "$tmp/now.md") - 2)) rows)"
