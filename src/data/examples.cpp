// Example dataset builders (see examples.h). The dictd .dict.dz is gzip-compatible, so zlib reads
// it whole; the index gives (headword, base64 offset, base64 length) into the uncompressed text.
// Word choice: plain lowercase headwords whose richest entry has usage examples (a sign of a
// common word), taking that entry's first translation; every k-th of the sorted list is kept.
#include "data/examples.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace moetrain {
namespace {

using json = nlohmann::ordered_json;  // keys in insertion order: role before content

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "[examples] cannot open {} (is the Debian package installed?)", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string read_gzip(const std::string& path) {
  gzFile g = gzopen(path.c_str(), "rb");
  MT_CHECK(g != nullptr, "[examples] cannot open {} (is dict-freedict-eng-deu installed?)", path);
  std::string out;
  std::vector<char> buf(1 << 20);
  int n;
  while ((n = gzread(g, buf.data(), static_cast<unsigned>(buf.size()))) > 0) out.append(buf.data(), n);
  int err = 0;
  const char* msg = gzerror(g, &err);
  gzclose(g);
  MT_CHECK(n == 0 && err == Z_OK, "[examples] {} is not a readable gzip/dictzip file: {}", path, msg ? msg : "?");
  return out;
}

std::string trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(a, b - a + 1));
}

bool plain_word(std::string_view w) {
  if (w.size() < 3 || w.size() > 12) return false;
  return std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

int count_examples(std::string_view body) {
  int n = 0;
  for (size_t p = body.find("\n      \""); p != std::string_view::npos; p = body.find("\n      \"", p + 1)) ++n;
  return n;
}

void write_jsonl(const std::string& path, const std::vector<json>& records) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    MT_CHECK(f.good(), "[examples] cannot create {}", tmp);
    for (const json& r : records) f << r.dump() << '\n';
    MT_CHECK(f.good(), "[examples] write to {} failed", tmp);
  }
  MT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "[examples] cannot rename {} to {}", tmp, path);
}

json chat(const std::string& word, const std::string& answer) {
  return json::array({{{"role", "user"}, {"content", "Translate to German: " + word}},
                      {{"role", "assistant"}, {"content", answer}}});
}

}  // namespace

int64_t dictd_base64_decode(std::string_view s) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  MT_CHECK(!s.empty() && s.size() <= 10, "[examples] bad dictd number '{}'", s);
  int64_t v = 0;
  for (char c : s) {
    const size_t d = kAlphabet.find(c);
    MT_CHECK(d != std::string_view::npos, "[examples] bad dictd base64 digit '{}' in '{}'", c, s);
    v = v * 64 + static_cast<int64_t>(d);
  }
  return v;
}

std::string dict_translation(std::string_view body) {
  const size_t nl = body.find('\n');
  if (nl == std::string_view::npos) return "";
  const size_t end = body.find('\n', nl + 1);
  const std::string_view line = body.substr(nl + 1, end == std::string_view::npos ? std::string_view::npos : end - nl - 1);
  // First item of the comma-separated list; commas inside <...>, [...] or (...) do not count.
  std::string item, gender;
  int depth = 0;
  for (char c : line) {
    if (c == '<' || c == '[' || c == '(') ++depth;
    if (c == '>' || c == ']' || c == ')') --depth;
    if ((c == ',' || c == ';') && depth == 0) break;
    item += c;
  }
  // Drop annotations and remember the grammatical gender.
  std::string word;
  for (size_t i = 0; i < item.size();) {
    const char open = item[i];
    if (open == '<' || open == '[' || open == '(') {
      const char close = open == '<' ? '>' : open == '[' ? ']' : ')';
      const size_t j = item.find(close, i);
      if (j == std::string::npos) return "";
      const std::string tag = item.substr(i + 1, j - i - 1);
      if (open == '<' && (tag == "masc" || tag == "fem" || tag == "neut")) gender = tag;
      i = j + 1;
      continue;
    }
    word += item[i++];
  }
  word = trim(word);
  // Collapse inner runs of spaces left by removed annotations.
  std::string clean;
  for (char c : word)
    if (!(c == ' ' && !clean.empty() && clean.back() == ' ')) clean += c;
  if (clean.empty() || clean.size() > 40) return "";
  for (char c : clean)
    if (c == '{' || c == '}' || c == '/' || c == '"' || c == '.' || c == '=' || (c >= '0' && c <= '9')) return "";
  if (std::count(clean.begin(), clean.end(), ' ') > 2) return "";
  if (gender == "masc") return "der " + clean;
  if (gender == "fem") return "die " + clean;
  if (gender == "neut") return "das " + clean;
  return clean;
}

std::vector<std::string> split_fortunes(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    if (line == "%" || line == "%\r") {
      if (std::string t = trim(cur); !t.empty()) out.push_back(std::move(t));
      cur.clear();
    } else {
      cur.append(line);
      cur += '\n';
    }
    pos = nl + 1;
  }
  if (std::string t = trim(cur); !t.empty()) out.push_back(std::move(t));
  return out;
}

ExampleCounts build_examples(const std::string& out_dir, const ExampleSources& src, int64_t max_words) {
  MT_CHECK(max_words >= 2, "[examples] max_words {} must be at least 2", max_words);
  const std::string index = read_file(src.dict_index);
  const std::string dict = read_gzip(src.dict_data);

  // headword -> (example count, translation) of its richest entry; ties keep the earlier entry.
  std::map<std::string, std::pair<int, std::string>> best;
  std::istringstream lines(index);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    MT_CHECK(t1 != std::string::npos && t2 != std::string::npos, "[examples] {}:{}: expected 'headword<TAB>offset<TAB>"
             "length'", src.dict_index, line_no);
    const std::string head = line.substr(0, t1);
    if (!plain_word(head)) continue;
    const int64_t off = dictd_base64_decode(line.substr(t1 + 1, t2 - t1 - 1));
    const int64_t len = dictd_base64_decode(trim(line.substr(t2 + 1)));
    MT_CHECK(off + len <= static_cast<int64_t>(dict.size()), "[examples] {}:{}: entry outside {} ({} bytes)",
             src.dict_index, line_no, src.dict_data, dict.size());
    const std::string_view body(dict.data() + off, static_cast<size_t>(len));
    // The entry's own headword must be the plain index word (no hyphens or capitals dropped).
    if (body.substr(0, head.size()) != head || (body.size() > head.size() && body[head.size()] != ' ' &&
                                                body[head.size()] != '\n'))
      continue;
    const int examples = count_examples(body);
    if (examples == 0) continue;
    auto it = best.find(head);
    if (it != best.end() && it->second.first >= examples) continue;
    std::string tr = dict_translation(body);
    if (tr.empty()) continue;
    best[head] = {examples, std::move(tr)};
  }
  std::vector<std::pair<std::string, std::string>> words;  // sorted by headword
  for (auto& [w, v] : best) {
    std::string lower = v.second;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower != w) words.push_back({w, v.second});  // skip words "translated" to themselves
  }
  MT_CHECK(words.size() >= 2, "[examples] {} gave only {} usable words", src.dict_index, words.size());
  // Evenly spaced selection over the alphabet.
  std::vector<std::pair<std::string, std::string>> pick;
  const int64_t n = static_cast<int64_t>(words.size()), k = std::min<int64_t>(n, max_words);
  for (int64_t i = 0; i < k; ++i) pick.push_back(words[static_cast<size_t>(i * n / k)]);

  std::vector<json> sft, pref;
  for (const auto& [w, tr] : pick) sft.push_back({{"messages", chat(w, tr)}});
  const size_t m = pick.size();
  for (size_t i = 0; i < m; ++i) {
    // Rejected: the translation of a word half the list away (the next one whose differs).
    size_t j = (i + m / 2) % m;
    for (size_t tries = 0; pick[j].second == pick[i].second && tries < m; ++tries) j = (j + 1) % m;
    if (pick[j].second == pick[i].second) continue;
    pref.push_back({{"prompt", json::array({{{"role", "user"}, {"content", "Translate to German: " + pick[i].first}}})},
                    {"chosen", pick[i].second},
                    {"rejected", pick[j].second}});
  }
  std::vector<json> fortunes;
  for (std::string& f : split_fortunes(read_file(src.fortunes))) fortunes.push_back({{"text", std::move(f)}});

  write_jsonl(out_dir + "/dict_sft.jsonl", sft);
  write_jsonl(out_dir + "/dict_pref.jsonl", pref);
  write_jsonl(out_dir + "/fortunes.jsonl", fortunes);
  return {static_cast<int64_t>(sft.size()), static_cast<int64_t>(pref.size()), static_cast<int64_t>(fortunes.size())};
}

}  // namespace moetrain
