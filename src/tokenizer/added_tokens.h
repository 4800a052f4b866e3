// Added/special token matching, done before pre-tokenization: leftmost-longest matches of the
// token strings (as HF's Aho-Corasick set), then HF's flags: single_word (no word character
// right before or after, else the match is skipped), lstrip/rstrip (the match swallows the
// whitespace on that side). A byte trie with a first-byte filter keeps plain text fast.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/unicode_text.h"

namespace moetrain {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

class AddedTokenMatcher {
 public:
  // `pattern` is the text to find (the content, normalized for normalized tokens).
  void add(const std::string& pattern, const AddedToken& token);
  bool empty() const { return tokens_.empty(); }

  // Calls fn(piece, -1) for plain text between matches and fn(span, id) for each token match.
  // Empty plain pieces are not reported.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;  // byte -> node
    int32_t token = -1;                             // index into tokens_ when a pattern ends here
  };
  // Longest pattern starting at text[pos]: its length and token index, or false.
  bool longest_at(std::string_view text, size_t pos, size_t* len, int32_t* token) const;

  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
  std::vector<AddedToken> tokens_;
};

template <typename Fn>
void AddedTokenMatcher::split(std::string_view text, Fn&& fn) const {
  const size_t n = text.size();
  size_t start_offset = 0, pos = 0;
  while (pos < n) {
    while (pos < n && !first_[static_cast<unsigned char>(text[pos])]) ++pos;
    if (pos >= n) break;
    size_t len = 0;
    int32_t t = -1;
    if (!longest_at(text, pos, &len, &t)) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[static_cast<size_t>(t)];
    size_t start = pos, stop = pos + len;
    if (tok.single_word) {
      size_t cs = 0;
      bool start_ok = start == 0 || !is_word_char(prev_code_point(text, start, &cs));
      size_t j = stop;
      bool stop_ok = stop == n || !is_word_char(next_code_point(text, j));
      if (!start_ok || !stop_ok) {
        pos = stop;  // the set's search resumes after the skipped match
        continue;
      }
    }
    if (tok.lstrip) {
      while (start > start_offset) {
        size_t cs = 0;
        if (!is_unicode_whitespace(prev_code_point(text, start, &cs))) break;
        start = std::max(cs, start_offset);
      }
    }
    if (tok.rstrip) {
      while (stop < n) {
        size_t j = stop;
        if (!is_unicode_whitespace(next_code_point(text, j))) break;
        stop = j;
      }
    }
    if (start_offset < start) fn(text.substr(start_offset, start - start_offset), -1);
    fn(text.substr(start, stop - start), tok.id);
    start_offset = pos = stop;
  }
  if (start_offset < n) fn(text.substr(start_offset), -1);
}

}  // namespace moetrain
