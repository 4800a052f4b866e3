#!/usr/bin/env node
// Times Hugging Face tokenizers (@anush008/tokenizers = HF tokenizers 0.22 via N-API) on a JSONL
// corpus: encode of every record one call at a time (awaited, so one encode runs at a time),
// then encodeBatch of all records. Run with TOKENIZERS_PARALLELISM=false for a single-thread
// batch figure. usage: node tokenizer_bench.js tokenizer.json corpus.jsonl [label]
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '../tests/reference/node/node_modules/@anush008/tokenizers'));

(async () => {
  const [tokFile, corpus, label = 'hf'] = process.argv.slice(2);
  const texts = fs.readFileSync(corpus, 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l).text);
  const bytes = texts.reduce((a, t) => a + Buffer.byteLength(t), 0);
  const tok = Tokenizer.fromFile(tokFile);
  const report = (what, tokens, s) => console.log(`${label} ${what.padEnd(36)} ${(tokens / s).toFixed(0).padStart(10)} tokens/s  ${(bytes / s / 1e6).toFixed(2).padStart(7)} MB/s  (${s.toFixed(3)} s)`);
  const perLine = async () => {
    const t0 = process.hrtime.bigint();
    let n = 0;
    for (const t of texts) n += (await tok.encode(t, null, { addSpecialTokens: false })).getIds().length;
    return [n, Number(process.hrtime.bigint() - t0) / 1e9];
  };
  const batch = async () => {
    const t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(texts, { addSpecialTokens: false });
    let n = 0;
    for (const e of encs) n += e.getIds().length;
    return [n, Number(process.hrtime.bigint() - t0) / 1e9];
  };
  let [n, s] = await perLine();
  report('encode per record, cold cache', n, s);
  [n, s] = await perLine();
  report('encode per record, warm cache', n, s);
  const par = process.env.TOKENIZERS_PARALLELISM === 'false' ? '1 thread' : 'all threads';
  [n, s] = await batch();
  report(`encodeBatch (${par})`, n, s);
})();
