#!/usr/bin/env node
// Checks moetrain's tokenizer output against Hugging Face tokenizers (@anush008/tokenizers,
// tokenizers 0.22): for every corpus record, moetrain's ids line must equal HF's encode
// (add_special_tokens=false), moetrain's decoding must equal HF's decode of the same ids, and
// (unless --no-roundtrip) decode(encode(x)) must be x (NFC(x) with --nfc).
// usage: node compare_tokenize.js --tokenizer tokenizer.json --corpus c.jsonl --ids ids.txt
//          --decoded decoded.jsonl [--nfc] [--no-roundtrip] [--name label]
'use strict';
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');

const args = process.argv.slice(2);
const opt = (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };
const has = (k) => args.includes(k);
const name = opt('--name', opt('--tokenizer'));
const readLines = (f) => { const t = fs.readFileSync(f, 'utf8'); const l = t.split('\n'); if (l[l.length - 1] === '') l.pop(); return l; };

(async () => {
  const tok = Tokenizer.fromFile(opt('--tokenizer'));
  const texts = readLines(opt('--corpus')).map((l) => JSON.parse(l).text);
  const ids = readLines(opt('--ids'));
  const decoded = readLines(opt('--decoded')).map((l) => JSON.parse(l).text);
  const problems = [];
  const report = (kind, i, detail) => { if (problems.length < 8) problems.push(`${kind} in record ${i + 1} ${JSON.stringify(texts[i]).slice(0, 300)}\n    ${detail}`); };
  if (ids.length !== texts.length || decoded.length !== texts.length) {
    console.error(`${name}: ${texts.length} records but ${ids.length} id lines and ${decoded.length} decoded records`);
    process.exit(1);
  }
  let bad = 0, tokens = 0;
  for (let i = 0; i < texts.length; ++i) {
    const ref = (await tok.encode(texts[i], null, { addSpecialTokens: false })).getIds();
    tokens += ref.length;
    const got = ids[i] === '' ? [] : ids[i].split(' ').map(Number);
    let ok = ref.length === got.length && ref.every((v, k) => v === got[k]);
    if (!ok) {
      let k = 0; while (k < ref.length && ref[k] === got[k]) ++k;
      report('id mismatch', i, `first difference at token ${k}: hf ${JSON.stringify(ref.slice(k, k + 8))} moetrain ${JSON.stringify(got.slice(k, k + 8))}`);
    } else {
      const hfText = await tok.decode(ref, false);
      if (hfText !== decoded[i]) { ok = false; report('decode differs from HF', i, `hf ${JSON.stringify(hfText).slice(0, 200)} moetrain ${JSON.stringify(decoded[i]).slice(0, 200)}`); }
    }
    if (ok && !has('--no-roundtrip')) {
      const want = has('--nfc') ? texts[i].normalize('NFC') : texts[i];
      if (decoded[i] !== want) { ok = false; report('roundtrip', i, `decode(encode(x)) = ${JSON.stringify(decoded[i]).slice(0, 200)}`); }
    }
    if (!ok) ++bad;
  }
  for (const p of problems) console.error(`${name}: ${p}`);
  console.log(`${name}: ${texts.length - bad}/${texts.length} records identical to HF tokenizers (${tokens} tokens)`);
  process.exit(bad ? 1 : 0);
})().catch((e) => { console.error(`${name}: ${e.stack || e}`); process.exit(2); });
