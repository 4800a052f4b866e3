// Byte trie for added-token matching (see added_tokens.h).
#include "tokenizer/added_tokens.h"

#include <algorithm>

namespace moetrain {

void AddedTokenMatcher::add(const std::string& pattern, const AddedToken& token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    auto& kids = nodes_[static_cast<size_t>(node)].kids;
    auto it = std::find_if(kids.begin(), kids.end(), [c](auto& k) { return k.first == c; });
    if (it != kids.end()) {
      node = it->second;
    } else {
      auto fresh = static_cast<int32_t>(nodes_.size());
      kids.emplace_back(c, fresh);  // `kids` may dangle after the push below; not used again
      nodes_.emplace_back();
      node = fresh;
    }
  }
  first_[static_cast<unsigned char>(pattern[0])] = true;
  Node& end = nodes_[static_cast<size_t>(node)];
  if (end.token >= 0) {
    tokens_[static_cast<size_t>(end.token)] = token;  // same string twice: the last one wins
    return;
  }
  end.token = static_cast<int32_t>(tokens_.size());
  tokens_.push_back(token);
}

bool AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t* len,
                                   int32_t* token) const {
  int32_t node = 0;
  bool found = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& kids = nodes_[static_cast<size_t>(node)].kids;
    auto c = static_cast<unsigned char>(text[i]);
    int32_t nextn = -1;
    for (const auto& k : kids)
      if (k.first == c) {
        nextn = k.second;
        break;
      }
    if (nextn < 0) break;
    node = nextn;
    if (nodes_[static_cast<size_t>(node)].token >= 0) {
      found = true;
      *len = i + 1 - pos;
      *token = nodes_[static_cast<size_t>(node)].token;
    }
  }
  return found;
}

}  // namespace moetrain
