// Example-dataset builders: dictd base64 numbers, translation extraction, fortune splitting, and
// a whole build from a small synthetic dictionary (gzip-compressed here with zlib) checked record
// by record.
#include <gtest/gtest.h>
#include <zlib.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "data/examples.h"
#include "data_test_util.h"

using namespace moetrain;
using namespace moetrain::testing;

namespace {

std::string b64(int64_t v) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  do {
    s.insert(s.begin(), a[v % 64]);
    v /= 64;
  } while (v > 0);
  return s;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);) out.push_back(nlohmann::json::parse(l));
  return out;
}

}  // namespace

TEST(Examples, DictdBase64) {
  EXPECT_EQ(dictd_base64_decode("A"), 0);
  EXPECT_EQ(dictd_base64_decode("B"), 1);
  EXPECT_EQ(dictd_base64_decode("/"), 63);
  EXPECT_EQ(dictd_base64_decode("BA"), 64);
  EXPECT_EQ(dictd_base64_decode("x"), 49);
  EXPECT_EQ(dictd_base64_decode("J4eR"), ((9 * 64 + 56) * 64 + 30) * 64 + 17);
  for (int64_t v : {0LL, 5LL, 4095LL, 123456789LL}) EXPECT_EQ(dictd_base64_decode(b64(v)), v);
  EXPECT_THROW(dictd_base64_decode("A-B"), Error);
  EXPECT_THROW(dictd_base64_decode(""), Error);
}

TEST(Examples, TranslationExtraction) {
  EXPECT_EQ(dict_translation("dog /dog/\nHund <masc> [zool.]\n      \"x\" - y\n"), "der Hund");
  EXPECT_EQ(dict_translation("cat /k/\nKatze <fem>, Mieze <fem>\n"), "die Katze");
  EXPECT_EQ(dict_translation("house /h/\nHaus <neut>\n"), "das Haus");
  EXPECT_EQ(dict_translation("beautiful /b/\nsch\xc3\xb6n <adj>\n"), "sch\xc3\xb6n");
  EXPECT_EQ(dict_translation("run /r/ <v>\nlaufen <v, intr>, rennen\n"), "laufen");  // comma inside <> kept
  EXPECT_EQ(dict_translation("run /r/\n [Am.] Laufmasche <fem>, Fallmasche <fem>\n"), "die Laufmasche");
  EXPECT_EQ(dict_translation("x /x/\nsee: {y}\n"), "");
  EXPECT_EQ(dict_translation("only one line"), "");
  EXPECT_EQ(dict_translation("x /x/\nauf etw. achten\n"), "");  // abbreviations are not clean answers
}

TEST(Examples, FortuneSplitting) {
  EXPECT_EQ(split_fortunes("one\n%\ntwo\nlines\n%\n%\n  \n%\nlast"),
            (std::vector<std::string>{"one", "two\nlines", "last"}));
  EXPECT_EQ(split_fortunes("a 100% sure\n%\n"), (std::vector<std::string>{"a 100% sure"}));
  EXPECT_TRUE(split_fortunes("%\n%\n").empty());
}

TEST(Examples, BuildFromSyntheticDictionary) {
  TempDir dir;
  // Entries: headword lines as in FreeDict; "dog" has two entries, the one with examples wins.
  struct E { std::string head, body; };
  std::vector<E> entries = {
      {"apple", "apple /a/\nApfel <masc>\n      \"peel an apple\"  - einen Apfel sch\xc3\xa4len\n"},
      {"dog", "dog /d/\nBandhaken <masc>\n"},
      {"dog", "dog /d/\nHund <masc> [zool.]\n      \"train a dog\"  - einen Hund abrichten\n      \"a\" - b\n"},
      {"ill mannered", "ill-mannered /i/\nungezogen\n      \"x\"  - y\n"},  // not a plain word
      {"hotel", "hotel /h/\nHotel <neut>\n      \"x\"  - y\n"},                // kept: answer is "das Hotel"
      {"water", "water /w/\nWasser <neut>\n      \"x\"  - y\n"},
      {"ok", "ok /o/\nokay\n      \"x\"  - y\n"},                                // too short
  };
  std::string dict = "00-database-info\nheader text\n\n", index;
  for (const E& e : entries) {
    index += e.head + "\t" + b64(static_cast<int64_t>(dict.size())) + "\t" + b64(static_cast<int64_t>(e.body.size())) + "\n";
    dict += e.body;
  }
  write_text(dir / "d.index", index);
  gzFile g = gzopen((dir / "d.dict.dz").c_str(), "wb");
  gzwrite(g, dict.data(), static_cast<unsigned>(dict.size()));
  gzclose(g);
  write_text(dir / "fortunes", "Fortune one.\n%\nFortune\ntwo.\n%\n");
  ExampleSources src{dir / "d.index", dir / "d.dict.dz", dir / "fortunes"};
  ExampleCounts c = build_examples(dir.path(), src, 100);
  EXPECT_EQ(c.sft, 4);
  EXPECT_EQ(c.pref, 4);
  EXPECT_EQ(c.fortunes, 2);
  auto sft = read_jsonl(dir / "dict_sft.jsonl");
  ASSERT_EQ(sft.size(), 4u);
  std::vector<std::pair<std::string, std::string>> want = {
      {"apple", "der Apfel"}, {"dog", "der Hund"}, {"hotel", "das Hotel"}, {"water", "das Wasser"}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(sft[i]["messages"][0]["role"], "user");
    EXPECT_EQ(sft[i]["messages"][0]["content"], "Translate to German: " + want[i].first);
    EXPECT_EQ(sft[i]["messages"][1]["role"], "assistant");
    EXPECT_EQ(sft[i]["messages"][1]["content"], want[i].second);
  }
  auto pref = read_jsonl(dir / "dict_pref.jsonl");
  ASSERT_EQ(pref.size(), 4u);
  for (size_t i = 0; i < pref.size(); ++i) {
    EXPECT_EQ(pref[i]["prompt"][0]["content"], "Translate to German: " + want[i].first);
    EXPECT_EQ(pref[i]["chosen"], want[i].second);
    EXPECT_EQ(pref[i]["rejected"], want[(i + 2) % 4].second);  // half the list away
  }
  auto f = read_jsonl(dir / "fortunes.jsonl");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[1]["text"], "Fortune\ntwo.");
  for (const std::string& n : dir.files()) EXPECT_EQ(n.find(".tmp"), std::string::npos) << n;
  // Deterministic bytes.
  auto before = read_bytes(dir / "dict_pref.jsonl");
  build_examples(dir.path(), src, 100);
  EXPECT_EQ(read_bytes(dir / "dict_pref.jsonl"), before);
  // Fewer words: evenly spaced picks.
  c = build_examples(dir.path(), src, 2);
  EXPECT_EQ(c.sft, 2);
  sft = read_jsonl(dir / "dict_sft.jsonl");
  EXPECT_EQ(sft[0]["messages"][1]["content"], "der Apfel");
  EXPECT_EQ(sft[1]["messages"][1]["content"], "das Hotel");
}
