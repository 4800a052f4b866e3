#!/bin/bash
# e2e: `moetrain init` then `moetrain export` round trips (bf16 -> fused f32 -> per-expert bf16
# reproduces the first export byte for byte), bad input fails with exit 1 and leaves no output.
# Usage: init_export.sh /path/to/moetrain
set -euo pipefail
M="$1"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$M" init --preset tiny-moe --num-layers 2 --seed 5 --output "$T/a" --max-shard-size 20KB
[ -f "$T/a/config.json" ] && [ -f "$T/a/generation_config.json" ] && [ -f "$T/a/model.safetensors.index.json" ] \
  || fail "init output incomplete"
"$M" export --input "$T/a" --output "$T/f" --dtype f32 --expert-layout fused --max-shard-size 1GB
[ -f "$T/f/model.safetensors" ] || fail "fused export missing model.safetensors"
grep -q '"torch_dtype": "float32"' "$T/f/config.json" || fail "f32 export config dtype"
"$M" export --input "$T/f" --output "$T/b" --max-shard-size 20KB
for f in "$T"/a/*.safetensors "$T/a/model.safetensors.index.json"; do
  cmp -s "$f" "$T/b/$(basename "$f")" || fail "round trip differs in $(basename "$f")"
done
# Same seed, same bytes; another seed differs.
"$M" init --preset tiny-moe --num-layers 2 --seed 5 --output "$T/a2" --max-shard-size 20KB
cmp -s "$T/a/model-00001-of-"*.safetensors "$T/a2/$(basename "$T"/a/model-00001-of-*.safetensors)" \
  || fail "init is not deterministic"

# Errors: exit code 1, a message naming the problem, nothing left behind.
if "$M" export --input "$T/a" --output "$T/a" 2>"$T/err"; then fail "export onto its input succeeded"; fi
grep -q "input directory" "$T/err" || fail "unclear error: $(cat "$T/err")"
echo '{"model_type": "llama"}' > "$T/bad.json"
if "$M" init --config "$T/bad.json" --output "$T/x" 2>"$T/err"; then fail "bad config accepted"; fi
grep -q "model_type" "$T/err" && grep -q "bad.json" "$T/err" || fail "unclear error: $(cat "$T/err")"
[ ! -e "$T/x" ] || fail "output left behind"
rm "$T/f/model.safetensors"
if "$M" export --input "$T/f" --output "$T/y" 2>"$T/err"; then fail "export of an empty model succeeded"; fi
[ ! -e "$T/y" ] || fail "output left behind"
ls "$T" | grep -q tmp && fail "temporary directory left behind"
echo "init_export: OK"
