#!/usr/bin/env bash
# Builds the example datasets from installed Debian packages (dict-freedict-eng-deu, fortunes-min)
# and, when a tokenizer directory is given, prepares them into indexed datasets.
#   examples/data/build_examples.sh OUT_DIR [TOKENIZER_DIR] [MOETRAIN_BINARY]
# OUT_DIR/dict_sft.jsonl   English->German word-translation chats (3000)
# OUT_DIR/dict_pref.jsonl  preference pairs: chosen = right translation, rejected = another word's
# OUT_DIR/fortunes.jsonl   text records
set -euo pipefail
OUT=${1:?usage: build_examples.sh OUT_DIR [TOKENIZER_DIR] [MOETRAIN_BINARY]}
TOK=${2:-}
MT=${3:-$(command -v moetrain || echo build/moetrain)}
"$MT" examples --output "$OUT"
if [[ -n "$TOK" ]]; then
  "$MT" prepare --input "$OUT/dict_sft.jsonl" --tokenizer "$TOK" --output "$OUT/dict_sft" --valid-fraction 0.05
  "$MT" prepare --input "$OUT/dict_pref.jsonl" --tokenizer "$TOK" --output "$OUT/dict_pref" --valid-fraction 0.05
  "$MT" prepare --input "$OUT/fortunes.jsonl" --tokenizer "$TOK" --output "$OUT/fortunes" --append-eod
fi
