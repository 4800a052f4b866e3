#!/usr/bin/env bash
# Renders the conversations of tests/reference/chat (cases.txt: Qwen3 and Llama-3 templates from
# tests/reference/node/node_modules, plus moetrain's own feature templates) with
# `moetrain chat-render` and requires byte-identical output to @huggingface/jinja: to the stored
# expected/<case>.txt always, and to a live node rendering when node and node_modules exist.
# Usage: chat_template_compare.sh <moetrain binary>
set -uo pipefail
bin=${1:?usage: chat_template_compare.sh <moetrain binary>}
root=$(cd "$(dirname "$0")/../.." && pwd)
chat=$root/tests/reference/chat
node_js=$root/tests/reference/node/render_chat_template.js
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
live=0
if command -v node > /dev/null && [ -d "$root/tests/reference/node/node_modules/@huggingface/jinja" ]; then live=1; fi
fail=0 checked=0
while read -r name tmpl input; do
  case "$name" in ''|'#'*) continue ;; esac
  if [ ! -f "$root/$tmpl" ]; then
    echo "SKIP $name: $tmpl is missing (run 'npm ci' in tests/reference/node)"
    continue
  fi
  if ! "$bin" chat-render --template "$root/$tmpl" --input "$root/$input" > "$tmp/$name.mt" 2> "$tmp/$name.err"; then
    echo "FAIL $name: moetrain chat-render exited with an error:"; cat "$tmp/$name.err"; fail=1; continue
  fi
  checked=$((checked + 1))
  if ! cmp -s "$tmp/$name.mt" "$chat/expected/$name.txt"; then
    echo "FAIL $name: output differs from tests/reference/chat/expected/$name.txt:"
    diff "$chat/expected/$name.txt" "$tmp/$name.mt" | head -40
    fail=1
  fi
  if [ "$live" = 1 ]; then
    node "$node_js" "$root/$tmpl" "$root/$input" > "$tmp/$name.ref" 2> /dev/null
    if ! cmp -s "$tmp/$name.mt" "$tmp/$name.ref"; then
      echo "FAIL $name: output differs from @huggingface/jinja (live):"
      diff "$tmp/$name.ref" "$tmp/$name.mt" | head -40
      fail=1
    fi
  fi
  echo "ok   $name ($(grep -c '^<<<record' "$tmp/$name.mt") records$([ "$live" = 1 ] && echo ', live node check'))"
done < "$chat/cases.txt"
if [ "$checked" -eq 0 ]; then echo "FAIL: no case was checked"; exit 1; fi
exit $fail
