// The Split pre-tokenizer: a PCRE2 regex (compiled with UTF, UCP and JIT, so \p{L}, \s and
// (?i:...) follow Unicode like the Oniguruma engine HF uses) or a literal, and HF's delimiter
// behaviours (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous, with invert).
// Compiled code is shared; match data and the JIT stack are per thread, so split() is
// thread-safe.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace moetrain {

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The default regex of GPT-2's ByteLevel pre-tokenizer (use_regex: true).
inline constexpr const char* kGpt2SplitRegex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Rewrites \s (and \S outside classes) as the Unicode White_Space set, which is what \s means
// in Oniguruma; PCRE2's \s under UCP also matches U+180E. Everything else is left as written.
std::string oniguruma_compatible_regex(std::string_view pattern);

class RegexSplitter {
 public:
  // `where` names the file and key for error messages.
  RegexSplitter(const std::string& pattern, bool literal, SplitBehavior behavior, bool invert,
                const std::string& where);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Calls fn(piece) for every non-empty piece of `text` (valid UTF-8), in order.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const;

 private:
  // Next non-empty match at or after `from`: sets [*b, *e) and returns true.
  bool next_match(std::string_view text, size_t from, size_t* b, size_t* e) const;

  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
  SplitBehavior behavior_;
  bool invert_;
};

template <typename Fn>
void RegexSplitter::split(std::string_view text, Fn&& fn) const {
  // Walk alternating (gap, match) spans; `pending` holds a span waiting to be merged with the
  // next one (MergedWithNext) or with following spans of the same kind (Contiguous).
  size_t pending_b = 0, pending_e = 0;
  bool pending = false, pending_is_match = false;
  auto emit = [&](size_t b, size_t e) {
    if (e > b) fn(text.substr(b, e - b));
  };
  auto span = [&](size_t b, size_t e, bool is_match) {
    if (e == b) return;
    if (invert_) is_match = !is_match;
    switch (behavior_) {
      case SplitBehavior::kIsolated: emit(b, e); break;
      case SplitBehavior::kRemoved:
        if (!is_match) emit(b, e);
        break;
      case SplitBehavior::kMergedWithPrevious:
        // A delimiter joins the piece before it.
        if (is_match && pending) {
          emit(pending_b, e);
          pending = false;
        } else {
          if (pending) emit(pending_b, pending_e);
          if (is_match) emit(b, e);
          else { pending = true; pending_b = b; pending_e = e; }
        }
        break;
      case SplitBehavior::kMergedWithNext:
        // A delimiter joins the piece after it.
        if (is_match) {
          if (pending) emit(pending_b, pending_e);
          pending = true; pending_b = b; pending_e = e;
        } else if (pending) {
          emit(pending_b, e);
          pending = false;
        } else {
          emit(b, e);
        }
        break;
      case SplitBehavior::kContiguous:
        if (pending && pending_is_match && is_match) {
          pending_e = e;
        } else {
          if (pending) emit(pending_b, pending_e);
          pending = true; pending_b = b; pending_e = e; pending_is_match = is_match;
        }
        break;
    }
  };
  size_t pos = 0, mb = 0, me = 0;
  while (pos < text.size() && next_match(text, pos, &mb, &me)) {
    span(pos, mb, false);
    span(mb, me, true);
    pos = me;
  }
  span(pos, text.size(), false);
  if (pending) emit(pending_b, pending_e);
}

}  // namespace moetrain
