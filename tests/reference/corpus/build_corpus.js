#!/usr/bin/env node
// Builds the tokenizer comparison corpus deterministically (same machine -> same bytes): JSONL
// records {"text": ...} mixing English prose (fortunes, license texts, Debian copyright files),
// C/C++ headers, hand-written and seeded-random CJK/Arabic/Cyrillic/Devanagari/... text, digit
// runs, whitespace runs, emoji ZWJ sequences, special tokens inside text and Unicode edge cases.
// usage: node build_corpus.js --out corpus.jsonl [--small small.jsonl] [--min-bytes N]
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
const opt = (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };
const outFile = opt('--out', 'corpus.jsonl');
const smallFile = opt('--small', null);
const minBytes = Number(opt('--min-bytes', 1100000));

// mulberry32: a tiny seeded PRNG so the random sections are reproducible.
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const R = rng(20240611);
const pick = (a) => a[Math.floor(R() * a.length)];
const randInt = (lo, hi) => lo + Math.floor(R() * (hi - lo + 1));
const fromRange = (lo, hi) => String.fromCodePoint(randInt(lo, hi));

const records = [];   // every record
const small = [];     // a few hundred varied records for the tokenizer-variant checks
const add = (text, toSmall = false) => {
  if (!text) return;
  records.push(text);
  if (toSmall) small.push(text);
};
const readText = (f) => { try { return fs.readFileSync(f, 'utf8'); } catch { return null; } };
const listDir = (d) => { try { return fs.readdirSync(d).sort(); } catch { return []; } };

// ---- English prose -------------------------------------------------------------------------
for (const f of ['fortunes', 'literature', 'riddles']) {
  const t = readText(path.join('/usr/share/games/fortunes', f));
  if (!t) continue;
  t.split(/\n%\n/).forEach((x, i) => add(x, i % 40 === 0));
}
for (const f of listDir('/usr/share/common-licenses')) {
  const t = readText(path.join('/usr/share/common-licenses', f));
  if (!t) continue;
  t.split(/\n\n/).forEach((x, i) => add(i % 3 === 0 ? x : x + '\n\n', i % 50 === 0));
}
let copyrightBytes = 0;
for (const pkg of listDir('/usr/share/doc')) {
  if (copyrightBytes > 250000) break;
  const t = readText(path.join('/usr/share/doc', pkg, 'copyright'));
  if (!t || t.length > 20000) continue;
  copyrightBytes += t.length;
  t.split(/\n(?=\S)/).forEach((x) => add(x));
}

// ---- source code ---------------------------------------------------------------------------
const headers = ['stdio.h', 'stdlib.h', 'string.h', 'math.h', 'pthread.h', 'zlib.h', 'pcre2.h',
  'utf8proc.h', 'cblas.h', 'unistd.h', 'fcntl.h', 'signal.h', 'time.h', 'locale.h', 'wchar.h',
  'fmt/format.h', 'fmt/core.h', 'yaml-cpp/node/node.h', 'gtest/gtest.h', 'CLI/App.hpp'];
let codeBytes = 0;
for (const h of headers) {
  const t = readText(path.join('/usr/include', h));
  if (!t) continue;
  const lines = t.split('\n');
  for (let i = 0; i < lines.length && codeBytes < 400000; i += 30) {
    const chunk = lines.slice(i, i + 30).join('\n');
    codeBytes += chunk.length;
    add(chunk, i % 600 === 0);
  }
}

// ---- multilingual, hand-written --------------------------------------------------------------
const phrases = [
  '我们今天在北京开会，讨论人工智能的发展。', '机器学习模型需要大量的数据来训练。',
  '東京は日本の首都です。今日はとても暑いですね！', 'カタカナとひらがなを混ぜた文章：コンピューターでプログラムを書く。',
  '안녕하세요, 만나서 반갑습니다. 오늘 날씨가 좋네요.', '한국어 형태소 분석은 어렵습니다.',
  'مرحبا بالعالم! كيف حالك اليوم؟', 'اللغة العربية تُكتب من اليمين إلى اليسار، وفيها حركات مثل الفَتْحة والضَّمّة.',
  'Привет, мир! Как у тебя дела сегодня?', 'Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'नमस्ते दुनिया! आज मौसम बहुत अच्छा है।', 'हिन्दी देवनागरी लिपि में लिखी जाती है, जैसे क्षत्रिय और ज्ञान।',
  'Γειά σου κόσμε! Η γλώσσα είναι όμορφη.', 'שלום עולם! מה שלומך היום?', 'สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ',
  'Tiếng Việt có nhiều dấu: ă, â, ê, ô, ơ, ư, đ — người Việt Nam.', 'Ça va? Où est la bibliothèque? Voilà, garçon!',
  'Größe, Straße, Äpfel und Öl: schön übermäßig.', 'El niño comió jalapeños en la montaña; ¿verdad? ¡Sí!',
  'Türkçe: İstanbul, ığdır, şöyle, çiçek.', 'Polski: zażółć gęślą jaźń.', 'Ελληνικά και English mixed 混合 text 123.',
  'ქართული ენა', 'Հայերեն լեզու', 'ગુજરાતી ભાષા', 'தமிழ் மொழி', 'বাংলা ভাষা', 'ਪੰਜਾਬੀ', 'മലയാളം', 'ಕನ್ನಡ', 'తెలుగు',
  'አማርኛ', 'ᠮᠣᠩᠭᠣᠯ', 'ລາວ', 'ဗမာ', 'ខ្មែរ', 'ᏣᎳᎩ', 'ᚠᚢᚦᚨᚱᚲ',
];
for (let i = 0; i < 400; ++i) {
  const n = randInt(1, 4);
  let s = '';
  for (let k = 0; k < n; ++k) s += pick(phrases) + pick([' ', '', '\n', '  ', ' ']);
  add(s, i % 4 === 0);
}
// ---- multilingual, seeded random -------------------------------------------------------------
const scripts = [
  () => fromRange(0x4E00, 0x9FA5),                                   // CJK ideographs
  () => fromRange(0x3041, 0x3093),                                   // hiragana
  () => fromRange(0x30A1, 0x30F6),                                   // katakana
  () => fromRange(0xAC00, 0xD7A3),                                   // Hangul syllables
  () => fromRange(0x0430, 0x044F),                                   // Cyrillic
  () => fromRange(0x0621, 0x064A) + (R() < 0.3 ? fromRange(0x064B, 0x0652) : ''),  // Arabic + harakat
  () => fromRange(0x0915, 0x0939) + (R() < 0.5 ? pick(['ा', 'ि', 'ी', 'ु', 'े', 'ो', '्', 'ं']) : ''),
  () => fromRange(0x03B1, 0x03C9),                                   // Greek
  () => fromRange(0x05D0, 0x05EA),                                   // Hebrew
  () => fromRange(0x0E01, 0x0E2E),                                   // Thai
];
for (let i = 0; i < 2500; ++i) {
  const gen = pick(scripts);
  let s = '';
  const words = randInt(1, 12);
  for (let w = 0; w < words; ++w) {
    const len = randInt(1, 8);
    for (let k = 0; k < len; ++k) s += gen();
    s += pick([' ', ' ', ' ', '，', '。', ', ', '\n', '', '、', '. ', '؟ ', '। ']);
  }
  add(s, i % 25 === 0);
}

// ---- digits, whitespace, emoji, special tokens, edge cases --------------------------------------
const digits = () => { let s = ''; const n = randInt(1, 60); for (let k = 0; k < n; ++k) s += String(randInt(0, 9)); return s; };
for (let i = 0; i < 600; ++i) {
  add(pick([
    () => `${digits()}`, () => `id=${digits()}, value ${digits()}.${digits()}`,
    () => `+1 (${digits().slice(0, 3)}) 555-${randInt(1000, 9999)}`, () => `${randInt(1, 9)},${randInt(100, 999)},${randInt(100, 999)}.${randInt(0, 99)} USD`,
    () => `version 1.${randInt(0, 99)}.${randInt(0, 999)}-rc${randInt(1, 9)}`, () => `٣٤٥٦ ١٢ ০১২ ४५६ ７８９ ${digits()}`,
    () => `x${digits()}y${digits()}z`, () => `π ≈ 3.14159265358979323846264338327950288419716939937510`,
  ])(), i % 10 === 0);
}
const ws = [' ', '  ', '   ', '    ', '\t', '\t\t', '\n', '\n\n', '\n\n\n', '\r\n', '\r', ' \n', '\n ', ' \t \n', '\u00A0', '\u3000', '\u2009', '\u2003', '\u200B', '\u180E', '\u0085', '\u2028', '\u000B', '\u000C', '\uFEFF'];
for (let i = 0; i < 900; ++i) {
  let s = '';
  const n = randInt(1, 10);
  for (let k = 0; k < n; ++k) {
    let w = pick(ws);
    if (R() < 0.15) w = w.repeat(randInt(2, 40));
    s += w + pick(['word', 'Word', 'x', '1', '中文', '!', 'привет', '', '', 'a.b', "it's"]);
  }
  add(s, i % 9 === 0);
}
add(' '.repeat(5000) + 'end');
add('\n'.repeat(3000));
add('\t'.repeat(1000) + 'x' + ' '.repeat(1000));
const emoji = ['👨‍👩‍👧‍👦', '👩🏽‍💻', '🏳️‍🌈', '🇺🇸', '🇯🇵🇩🇪', '❤️', '👍🏿', '1️⃣', '#️⃣', '🧑‍🤝‍🧑', '😀', '🤖', '🐉', '✈️', '☕', '🫠', '🏴‍☠️', '👁️‍🗨️', '🧔‍♂️', '✊🏽'];
for (let i = 0; i < 500; ++i) {
  let s = '';
  const n = randInt(1, 8);
  for (let k = 0; k < n; ++k) s += pick(emoji) + pick(['', ' ', 'ok', '!', '\u200D', ' 好', '']);
  add(s, i % 10 === 0);
}
const specials = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>',
  '<|fim_prefix|>', '<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>',
  '<|reserved_special_token_5|>', '<|im_start', '<|im_start|', '<|im_end|>>', '<<|im_end|>', '<|', '|>',
  '<|endoftext|><|endoftext|>', ' <|im_start|> '];
for (let i = 0; i < 700; ++i) {
  let s = '';
  const n = randInt(1, 6);
  for (let k = 0; k < n; ++k) s += pick(specials) + pick(['user\nHello!', 'assistant\n', ' ', '', '\n', 'text', '  x', 'def f():\n    pass']);
  add(s, i % 7 === 0);
}
const edge = [
  "I'm, you're, he's, they'll, we've, I'd, DON'T, SHE'S, It'S, 'tis, rock 'n' roll", "don’t curly quotes ‘s’",
  'ſtraße long s and K Kelvin and Å angstrom', 'İstanbul DİKKAT ǅ ǈ', 'e\u0301 a\u0300 o\u0308 n\u0303 (decomposed)', 'Å Ω K ﬁ ﬂ ①', '\u0301\u0301 lone marks',
  '𝐀𝐁𝐂 𝔸𝔹 𝒜 math letters', '\u0000nul\u0001\u0002\u007f\u001b[31mred\u001b[0m', '\u200E\u200F\u202A\u202C bidi', 'a\u200Cb\u200Dc zw joiners',
  'abc123def 12abc ab12 a1b2c3', 'snake_case camelCase PascalCase kebab-case SCREAMING_CASE', 'https://example.com/path?q=1&r=2#frag',
  'user@example.org', '~!@#$%^&*()_+`-=[]{}|;\':",./<>?', '......!!!???---___===', '   leading and trailing   ',
  'tab\tseparated\tvalues\t', '[1, 2, 3] {"a": 1}', '𠀀𠀁𪚥 CJK ext B', '\uE000 private use \uF8FF', '\uFFFD replacement', '\uFFFC',
];
for (const e of edge) add(e, true);
// Strings for the added-token flag variant (make_tokenizer_variants.js adds <mask> lstrip,
// [SEP] rstrip, <both> lstrip+rstrip, "cat" single_word, "café" and "hello world" normalized).
const flagParts = ['<mask>', ' <mask>', '\t <mask> ', '[SEP]', '[SEP]  \n', 'x[SEP] y', '<both>', '  <both>  ',
  'cat', ' cat ', 'concat', 'cats', 'cat_', '_cat', 'cat.', '(cat)', 'café', 'cafe\u0301', 'CAFÉ', 'hello world',
  'hello  world', 'Hello world', 'say hello world!', '<|im_start|>', 'x'];
for (let i = 0; i < 300; ++i) {
  let s = '';
  const n = randInt(1, 6);
  for (let k = 0; k < n; ++k) s += pick(flagParts) + pick(['', ' ', '  ', '\n', 'a']);
  add(s, true);
}

// ---- fill up to minBytes with more header text, deterministically ------------------------------
let total = records.reduce((a, r) => a + Buffer.byteLength(r), 0);
for (const h of listDir('/usr/include').filter((f) => f.endsWith('.h'))) {
  if (total >= minBytes) break;
  const t = readText(path.join('/usr/include', h));
  if (!t) continue;
  const lines = t.split('\n');
  for (let i = 0; i < lines.length && total < minBytes; i += 40) {
    const chunk = lines.slice(i, i + 40).join('\n');
    total += Buffer.byteLength(chunk);
    add(chunk);
  }
}

const write = (f, recs) => fs.writeFileSync(f, recs.map((t) => JSON.stringify({ text: t })).join('\n') + '\n');
write(outFile, records);
if (smallFile) write(smallFile, small);
console.error(`corpus: ${records.length} records, ${total} bytes -> ${outFile}` +
  (smallFile ? `; ${small.length} records -> ${smallFile}` : ''));
if (total < minBytes) { console.error(`corpus: only ${total} bytes (< ${minBytes})`); process.exit(1); }
