#!/usr/bin/env bash
# End-to-end `moetrain prepare` and `moetrain examples`: builds the example JSONL files, prepares
# chat, text and preference datasets with a tiny byte-level tokenizer, and checks counts, the
# worker-count independence of the output bytes, error messages with line numbers, --on-error
# skip, and that failed or killed runs leave no finished-looking dataset behind.
# Usage: prepare.sh /path/to/moetrain
set -euo pipefail
MT=${1:?usage: prepare.sh MOETRAIN_BINARY}
W=$(mktemp -d /tmp/mt_e2e_prepare.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A byte-level BPE tokenizer with no merges (one token per byte) and ChatML specials.
python3 "$(dirname "$0")/lib/make_tiny_tokenizer.py" "$W/tok"

# ---- example datasets (only where the Debian packages are installed) ----
if [[ -f /usr/share/dictd/freedict-eng-deu.index && -f /usr/share/games/fortunes/fortunes ]]; then
  "$MT" examples --output "$W/ex" --max-words 500 > "$W/ex.log"
  [[ $(wc -l < "$W/ex/dict_sft.jsonl") -eq 500 ]] || fail "dict_sft.jsonl should have 500 records"
  [[ $(wc -l < "$W/ex/dict_pref.jsonl") -eq 500 ]] || fail "dict_pref.jsonl should have 500 records"
  [[ $(wc -l < "$W/ex/fortunes.jsonl") -gt 100 ]] || fail "fortunes.jsonl too short"
  grep -q '"Translate to German: ' "$W/ex/dict_sft.jsonl" || fail "dict_sft.jsonl content"
  "$MT" examples --output "$W/ex2" --max-words 500 > /dev/null
  cmp -s "$W/ex/dict_pref.jsonl" "$W/ex2/dict_pref.jsonl" || fail "examples are not deterministic"
  SFT=$W/ex/dict_sft.jsonl PREF=$W/ex/dict_pref.jsonl TEXT=$W/ex/fortunes.jsonl
else
  echo "note: dictionary/fortunes packages missing; using small inline data"
  for i in $(seq 1 200); do echo "{\"messages\":[{\"role\":\"user\",\"content\":\"q$i\"},{\"role\":\"assistant\",\"content\":\"a$i\"}]}"; done > "$W/sft.jsonl"
  for i in $(seq 1 50); do echo "{\"prompt\":\"p$i\",\"chosen\":\"yes$i\",\"rejected\":\"no$i\"}"; done > "$W/pref.jsonl"
  for i in $(seq 1 100); do echo "{\"text\":\"a longer line of text number $i, long enough to be truncated at thirty-two tokens\"}"; done > "$W/text.jsonl"
  SFT=$W/sft.jsonl PREF=$W/pref.jsonl TEXT=$W/text.jsonl
fi

# ---- chat: counts, split, worker independence ----
"$MT" prepare --input "$SFT" --tokenizer "$W/tok" --output "$W/sft" --valid-fraction 0.1 --seed 3 > "$W/sft.log"
"$MT" prepare --input "$SFT" --tokenizer "$W/tok" --output "$W/sft2" --valid-fraction 0.1 --seed 3 --workers 2 > /dev/null
for f in _train.bin _train.idx _train_mask.bin _train_mask.idx _valid.bin _valid.idx _valid_mask.bin _valid_mask.idx; do
  [[ -s "$W/sft$f" ]] || fail "missing $W/sft$f"
  cmp -s "$W/sft$f" "$W/sft2$f" || fail "sft$f differs between 1 and 2 workers"
done
grep -q "skipped 0" "$W/sft.log" || fail "chat log: $(cat "$W/sft.log")"
n=$(wc -l < "$SFT")
grep -q "records $n " "$W/sft.log" || fail "expected $n records: $(cat "$W/sft.log")"
[[ -z $(ls "$W" | grep '\.tmp$' || true) ]] || fail "temporary files left behind"

# ---- text: eod, truncation ----
"$MT" prepare --input "$TEXT" --tokenizer "$W/tok" --output "$W/text" --append-eod --max-length 32 > "$W/text.log"
grep -Eq "truncated [1-9]" "$W/text.log" || fail "expected truncated records: $(cat "$W/text.log")"
grep -q '"format": "text"' "$W/text_info.json" || fail "text info"

# ---- preference: pairs layout ----
"$MT" prepare --input "$PREF" --tokenizer "$W/tok" --output "$W/pref" > "$W/pref.log"
grep -q '"layout": "pairs"' "$W/pref_info.json" || fail "preference layout: $(cat "$W/pref_info.json")"

# ---- errors: line numbers, nothing written; skip counts ----
mkdir "$W/bad"
printf '%s\n' '{"text": "fine"}' '{"text": "oops"' '{"text": 3}' '{"text": "also fine"}' > "$W/bad/in.jsonl"
if "$MT" prepare --input "$W/bad/in.jsonl" --tokenizer "$W/tok" --output "$W/bad/out" 2> "$W/bad.err"; then
  fail "bad input accepted"
fi
grep -q "in.jsonl:2: malformed JSON" "$W/bad.err" || fail "error message: $(cat "$W/bad.err")"
[[ $(ls "$W/bad") == "in.jsonl" ]] || fail "failed run left files: $(ls "$W/bad")"
"$MT" prepare --input "$W/bad/in.jsonl" --tokenizer "$W/tok" --output "$W/bad/out" --on-error skip > "$W/skip.log"
grep -q "skipped 2" "$W/skip.log" || fail "skip count: $(cat "$W/skip.log")"
grep -q "in.jsonl:3: field 'text' must be a string" "$W/skip.log" || fail "skip report: $(cat "$W/skip.log")"

# ---- a killed run leaves no finished dataset ----
mkdir "$W/kill"
for i in $(seq 1 40); do cat "$SFT"; done > "$W/kill/big.jsonl"
"$MT" prepare --input "$W/kill/big.jsonl" --tokenizer "$W/tok" --output "$W/kill/out" > /dev/null 2>&1 &
pid=$!
sleep 0.3
kill -9 "$pid" 2> /dev/null && killed=1 || killed=0
wait "$pid" 2> /dev/null || true
if [[ $killed == 1 && ! -e "$W/kill/out_info.json" ]]; then
  [[ ! -e "$W/kill/out_train.idx" && ! -e "$W/kill/out_train.bin" ]] || fail "killed run left a dataset: $(ls "$W/kill")"
fi
echo "prepare e2e: OK"
