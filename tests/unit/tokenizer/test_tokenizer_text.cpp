// Unit tests of the tokenizer's building blocks: the GPT-2 byte map (known values), UTF-8
// repair (Unicode's maximal-subpart examples), the NFC fast path (checked against utf8proc's
// decompositions of every code point), BPE merges (hand-worked cases; linear and heap strategies
// agree on random tables) and the PCRE2 splitter (behaviours, \s rewrite).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <utf8proc.h>

#include "tokenizer/bpe_merge.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/unicode_text.h"
#include "tokenizer/word_cache.h"

namespace moetrain {
namespace {

TEST(ByteLevelMap, KnownValuesAndBijection) {
  ByteLevelMap m;
  EXPECT_EQ(m.to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(m.to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(m.to_unicode('\t'), 0x109u);  // 'ĉ'
  EXPECT_EQ(m.to_unicode(0), 0x100u);
  EXPECT_EQ(m.to_unicode(0x7F), 0x121u);
  EXPECT_EQ(m.to_unicode(0xAD), 0x143u);  // the last of the 68 remapped bytes
  EXPECT_EQ(m.to_unicode('A'), static_cast<char32_t>('A'));
  EXPECT_EQ(m.to_unicode(0xE9), 0xE9u);
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    char32_t u = m.to_unicode(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(u).second);
    EXPECT_EQ(m.to_byte(u), b);
  }
  EXPECT_EQ(m.to_byte(' '), -1);
  EXPECT_EQ(m.to_byte(0x4E2D), -1);
  std::string s;
  m.map(" a\n", s);
  EXPECT_EQ(s, "\xC4\xA0" "a" "\xC4\x8A");
}

TEST(Utf8, ValidationAndMaximalSubpartRepair) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_TRUE(is_valid_utf8("plain ascii text, long enough to use the 8-byte path"));
  EXPECT_TRUE(is_valid_utf8("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("abc\xE4\xB8"));       // truncated
  EXPECT_EQ(repair_utf8("a\xFF" "b"), "a" + r + "b");
  EXPECT_EQ(repair_utf8("\xE4\xB8"), r);                      // one subpart
  EXPECT_EQ(repair_utf8("\xF0\x80\x80"), r + r + r);           // F0 80 is never valid
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98" "x"), r + "x");
  EXPECT_EQ(repair_utf8("\xC3\xA9\x80"), "\xC3\xA9" + r);
  // Unicode 15 core spec table 3-8 example: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64
  EXPECT_EQ(repair_utf8("a\xF1\x80\x80\xE1\x80\xC2" "b\x80" "c\x80\xBF" "d"),
            "a" + r + r + r + "b" + r + "c" + r + r + "d");
}

TEST(Utf8, CodePointHelpers) {
  std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  size_t i = 0;
  EXPECT_EQ(next_code_point(s, i), U'a');
  EXPECT_EQ(next_code_point(s, i), 0xE9u);
  EXPECT_EQ(next_code_point(s, i), 0x4E2Du);
  EXPECT_EQ(next_code_point(s, i), 0x1F600u);
  EXPECT_EQ(i, s.size());
  size_t start = 0;
  EXPECT_EQ(prev_code_point(s, s.size(), &start), 0x1F600u);
  EXPECT_EQ(start, 6u);
  std::string e;
  for (char32_t c : {U'a', char32_t(0xE9), char32_t(0x4E2D), char32_t(0x1F600)}) append_utf8(e, c);
  EXPECT_EQ(e, s);
  EXPECT_TRUE(is_unicode_whitespace(0x3000));
  EXPECT_TRUE(is_unicode_whitespace(0x85));
  EXPECT_FALSE(is_unicode_whitespace(0x180E));
  EXPECT_FALSE(is_unicode_whitespace(0x200B));
  EXPECT_TRUE(is_word_char(U'_'));
  EXPECT_TRUE(is_word_char(0x4E2D));
  EXPECT_TRUE(is_word_char(0x0663));  // Arabic-Indic digit
  EXPECT_FALSE(is_word_char(U'-'));
  EXPECT_FALSE(is_word_char(0x1F600));
}

// Every code point the NFC fast path accepts must be NFC-stable, have combining class 0, and
// never appear as a non-first element of any canonical decomposition (so it cannot compose
// with what precedes it).
TEST(Normalizer, NfcFastPathIsSound) {
  std::vector<bool> second(0x110000, false);
  utf8proc_int32_t buf[32];
  for (utf8proc_int32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    int last = 0;
    auto n = utf8proc_decompose_char(c, buf, 32, UTF8PROC_DECOMPOSE, &last);
    for (utf8proc_ssize_t k = 1; k < n; ++k) second[static_cast<size_t>(buf[k])] = true;
  }
  ASSERT_TRUE(second[0x301] && second[0x3099] && second[0x1161]);  // acute, dakuten, Hangul V
  ASSERT_FALSE(second[0x4E2D] || second['a']);
  size_t checked = 0;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (!nfc_stable_fast(c) || (c >= 0xD800 && c <= 0xDFFF)) continue;
    ++checked;
    ASSERT_FALSE(second[c]) << std::hex << static_cast<uint32_t>(c);
    ASSERT_EQ(utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class, 0) << static_cast<uint32_t>(c);
    std::string s;
    append_utf8(s, c);
    utf8proc_uint8_t* out = nullptr;
    auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    ASSERT_GE(n, 0);
    std::string nfc(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    free(out);
    ASSERT_EQ(nfc, s) << std::hex << static_cast<uint32_t>(c);
  }
  EXPECT_GT(checked, 35000u);
}

TEST(Normalizer, FormsAndFastPath) {
  Normalizer nfc;
  nfc.add(NormalForm::kNFC);
  std::string buf;
  std::string_view plain = "plain text";
  EXPECT_EQ(nfc.apply(plain, buf).data(), plain.data());  // untouched, no copy
  EXPECT_EQ(nfc.apply("e\xCC\x81", buf), "\xC3\xA9");       // e + U+0301 -> é
  EXPECT_EQ(nfc.apply("\xE2\x84\xAB", buf), "\xC3\x85");     // Angstrom sign -> Å
  EXPECT_EQ(nfc.apply("\xEF\xAC\x81", buf), "\xEF\xAC\x81"); // ﬁ stays under NFC
  Normalizer nfkc;
  nfkc.add(NormalForm::kNFKC);
  EXPECT_EQ(nfkc.apply("\xEF\xAC\x81", buf), "fi");
  Normalizer seq;
  seq.add(NormalForm::kNFD);
  seq.add(NormalForm::kNFC);
  EXPECT_EQ(seq.apply("\xC3\xA9" "x", buf), "\xC3\xA9" "x");
  Normalizer nfd;
  nfd.add(NormalForm::kNFD);
  EXPECT_EQ(nfd.apply("\xC3\xA9", buf), "e\xCC\x81");
}

// The fast path must agree with running utf8proc on everything, on random strings mixing
// stable code points with combining marks, jamo, nukta, dakuten and singleton decompositions.
TEST(Normalizer, RandomStringsMatchUtf8proc) {
  const char32_t pool[] = {'a', 'e', 'Z', ' ', 0xE9, 0x301, 0x308, 0x327, 0x344, 0x1100, 0x1161,
                           0x11A8, 0xAC00, 0xAC01, 0x915, 0x93C, 0x93E, 0x94D, 0x2019, 0x2014,
                           0x2000, 0x212B, 0x3099, 0x304B, 0x30AB, 0x627, 0x64E, 0x653, 0x4E2D,
                           0xF900, 0x2F800, 0x1F600, 0x1F3FD, 0x5D0, 0x5B4, 0xE01, 0xE31, 0x41,
                           0x30A, 0x212A, 0x3B1, 0x301, 0x345, 0x1E0A, 0x323, 0x20000};
  std::mt19937 gen(11);
  Normalizer nfc;
  nfc.add(NormalForm::kNFC);
  for (int trial = 0; trial < 4000; ++trial) {
    std::string s;
    size_t n = 1 + gen() % 8;
    for (size_t k = 0; k < n; ++k) append_utf8(s, pool[gen() % std::size(pool)]);
    utf8proc_uint8_t* out = nullptr;
    auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                            static_cast<utf8proc_ssize_t>(s.size()), &out,
                            static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    ASSERT_GE(len, 0);
    std::string want(reinterpret_cast<char*>(out), static_cast<size_t>(len));
    free(out);
    std::string buf;
    ASSERT_EQ(std::string(nfc.apply(s, buf)), want) << trial;
  }
}

// Reference BPE: the textbook loop (find the lowest-rank pair, leftmost, merge, repeat) over a
// std::map, independent of MergeTable's hashing and both fast strategies.
std::vector<int32_t> reference_bpe(const std::map<std::pair<int, int>, std::pair<int, int>>& m,
                                   std::vector<int32_t> s) {
  while (s.size() > 1) {
    int best = INT32_MAX;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = m.find({s[i], s[i + 1]});
      if (it != m.end() && it->second.first < best) {
        best = it->second.first;
        bi = i;
      }
    }
    if (best == INT32_MAX) break;
    s[bi] = m.at({s[bi], s[bi + 1]}).second;
    s.erase(s.begin() + static_cast<long>(bi) + 1);
  }
  return s;
}

TEST(BpeMerge, HandWorkedCases) {
  // ids: a=0 b=1 c=2 ab=3 bc=4 abc=5 aa=6 aaaa=7
  MergeTable t;
  t.reserve(4);
  t.insert(1, 2, 0, 4);  // b c
  t.insert(0, 1, 1, 3);  // a b
  t.insert(0, 4, 2, 5);  // a bc
  t.insert(0, 0, 3, 6);  // a a
  t.insert(6, 6, 4, 7);  // aa aa
  BpeScratch sc;
  for (size_t linear_max : {size_t(0), size_t(64)}) {
    std::vector<int32_t> w = {0, 1, 2};  // "abc": b c (rank 0) first, then a bc
    bpe_merge(t, w, sc, linear_max);
    EXPECT_EQ(w, (std::vector<int32_t>{5}));
    w = {0, 1, 0, 1};  // "abab" -> ab ab (no "ab ab" merge)
    bpe_merge(t, w, sc, linear_max);
    EXPECT_EQ(w, (std::vector<int32_t>{3, 3}));
    w = {0, 0, 0};  // "aaa": leftmost a a first -> aa a
    bpe_merge(t, w, sc, linear_max);
    EXPECT_EQ(w, (std::vector<int32_t>{6, 0}));
    w = {0, 0, 0, 0, 0};  // "aaaaa" -> aaaa a
    bpe_merge(t, w, sc, linear_max);
    EXPECT_EQ(w, (std::vector<int32_t>{7, 0}));
    w = {2, 2};
    bpe_merge(t, w, sc, linear_max);
    EXPECT_EQ(w, (std::vector<int32_t>{2, 2}));
  }
  int32_t m = 0;
  EXPECT_EQ(t.find(0, 4, &m), 2);
  EXPECT_EQ(m, 5);
  EXPECT_EQ(t.find(4, 0, &m), MergeTable::kNone);
  t.insert(0, 4, 9, 5);  // a later duplicate line wins
  EXPECT_EQ(t.find(0, 4, &m), 9);
  EXPECT_EQ(t.size(), 5u);
}

TEST(BpeMerge, StrategiesAgreeWithReferenceOnRandomTables) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 30; ++trial) {
    const int alphabet = 3 + trial % 5;
    std::map<std::pair<int, int>, std::pair<int, int>> ref;
    MergeTable t;
    t.reserve(8);  // forces rehashing while inserting
    int next_id = alphabet;
    std::vector<int> ids(static_cast<size_t>(alphabet));
    for (int i = 0; i < alphabet; ++i) ids[static_cast<size_t>(i)] = i;
    for (int r = 0; r < 60; ++r) {
      int a = ids[gen() % ids.size()], b = ids[gen() % ids.size()];
      if (ref.count({a, b})) continue;
      ref[{a, b}] = {r, next_id};
      t.insert(a, b, r, next_id);
      ids.push_back(next_id++);
    }
    BpeScratch sc;
    for (int w = 0; w < 50; ++w) {
      std::vector<int32_t> word(1 + gen() % 300);
      for (auto& x : word) x = static_cast<int32_t>(gen() % static_cast<unsigned>(alphabet));
      auto expect = reference_bpe(ref, word);
      auto lin = word, heap = word;
      bpe_merge(t, lin, sc, SIZE_MAX);
      bpe_merge(t, heap, sc, 0);
      ASSERT_EQ(lin, expect) << "trial " << trial;
      ASSERT_EQ(heap, expect) << "trial " << trial;
    }
  }
}

// Concurrent readers and writers: every hit must return exactly the ids stored for that word
// (ids are a function of the word), through evictions of full probe windows.
TEST(WordCache, ConcurrentHitsAreExact) {
  WordCache cache;
  auto ids_for = [](const std::string& w) {
    std::vector<int32_t> ids;
    for (size_t k = 0; k < 1 + w.size() % 5; ++k) ids.push_back(static_cast<int32_t>(w.size() * 31 + k));
    return ids;
  };
  std::vector<std::string> words;
  for (int i = 0; i < 400000; ++i) words.push_back("w" + std::to_string(i * 2654435761u % 1000003));
  std::atomic<size_t> hits{0}, bad{0};
  auto work = [&](int t) {
    std::vector<int32_t> out;
    for (size_t i = static_cast<size_t>(t); i < words.size(); i += 3) {
      const std::string& w = words[(i * 7) % words.size()];
      uint64_t h = WordCache::hash_of(w);
      out.clear();
      if (cache.lookup(w, h, out)) {
        ++hits;
        if (out != ids_for(w)) ++bad;
      } else {
        auto ids = ids_for(w);
        cache.insert(w, h, ids.data(), ids.size());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < 3; ++t) pool.emplace_back(work, t);
  for (auto& th : pool) th.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(hits.load(), 10000u);
  std::vector<int32_t> out;
  EXPECT_FALSE(cache.lookup("never inserted", WordCache::hash_of("never inserted"), out));
  EXPECT_FALSE(WordCache::fits(60, 1));
  EXPECT_TRUE(WordCache::fits(10, 5));
}

std::vector<std::string> split_all(const RegexSplitter& s, std::string_view text) {
  std::vector<std::string> out;
  s.split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}
using Pieces = std::vector<std::string>;

TEST(RegexSplit, Behaviours) {
  auto make = [](SplitBehavior b, bool invert = false) {
    return std::make_unique<RegexSplitter>("-", true, b, invert, "test");
  };
  const std::string t = "a-b--c-";
  EXPECT_EQ(split_all(*make(SplitBehavior::kIsolated), t), (Pieces{"a", "-", "b", "-", "-", "c", "-"}));
  EXPECT_EQ(split_all(*make(SplitBehavior::kRemoved), t), (Pieces{"a", "b", "c"}));
  EXPECT_EQ(split_all(*make(SplitBehavior::kMergedWithPrevious), t), (Pieces{"a-", "b-", "-", "c-"}));
  EXPECT_EQ(split_all(*make(SplitBehavior::kMergedWithNext), t), (Pieces{"a", "-b", "-", "-c", "-"}));
  EXPECT_EQ(split_all(*make(SplitBehavior::kContiguous), t), (Pieces{"a", "-", "b", "--", "c", "-"}));
  EXPECT_EQ(split_all(*make(SplitBehavior::kRemoved, true), t), (Pieces{"-", "-", "-", "-"}));
  EXPECT_EQ(split_all(*make(SplitBehavior::kIsolated), ""), Pieces{});
}

TEST(RegexSplit, Gpt2AndQwenPatterns) {
  RegexSplitter gpt2(kGpt2SplitRegex, false, SplitBehavior::kIsolated, false, "test");
  EXPECT_EQ(split_all(gpt2, "Hello world's  123!!\n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " 123", "!!", "\n\n", " x"}));
  RegexSplitter qwen(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      false, SplitBehavior::kIsolated, false, "test");
  EXPECT_EQ(split_all(qwen, "I'LL go 42\u00e9t\u00e9 \u4e2d\u6587   x\n\n"),
            (Pieces{"I", "'LL", " go", " ", "4", "2", "\u00e9t\u00e9", " \u4e2d\u6587", "  ", " x", "\n\n"}));
  // U+180E is not whitespace for Oniguruma, so it is split like punctuation.
  EXPECT_EQ(split_all(qwen, "a \xE1\xA0\x8Ex"), (Pieces{"a", " \xE1\xA0\x8E", "x"}));
  // A very long whitespace run must not exhaust the JIT stack.
  std::string spaces(200000, ' ');
  auto p = split_all(qwen, spaces + "x");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].size(), spaces.size() - 1);
}

TEST(RegexSplit, OnigurumaRewriteAndErrors) {
  EXPECT_EQ(oniguruma_compatible_regex("a\\sb"), std::string("a[") + "\\x{9}-\\x{d}\\x{20}\\x{85}"
            "\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]b");
  std::string in_class = oniguruma_compatible_regex("[^\\s\\p{L}]");
  EXPECT_EQ(in_class.substr(0, 9), "[^\\x{9}-\\");
  EXPECT_EQ(in_class.substr(in_class.size() - 6), "\\p{L}]");
  EXPECT_EQ(oniguruma_compatible_regex("[]\\\\s][:alpha:]\\d"), "[]\\\\s][:alpha:]\\d");
  EXPECT_EQ(oniguruma_compatible_regex("\\S").substr(0, 3), "[^\\");
  try {
    RegexSplitter bad("(unclosed", false, SplitBehavior::kIsolated, false, "f.json: key 'k'");
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("f.json: key 'k'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moetrain
