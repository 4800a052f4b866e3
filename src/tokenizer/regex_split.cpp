// PCRE2 side of the Split pre-tokenizer (see regex_split.h). The JIT stack grows to 16 MiB so
// that backtracking over very long whitespace runs (\s+(?!\S)) cannot hit the default 32 KiB
// limit; a match error of any kind is reported rather than silently splitting differently.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <cctype>

#include <pcre2.h>

#include "core/check.h"

namespace moetrain {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state, shared by every splitter this thread uses.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(16, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    MT_CHECK(data && context && stack, "[tokenizer] out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& match_state() {
  thread_local ThreadMatchState s;
  return s;
}

// Unicode White_Space, as a class body.
constexpr const char* kWhiteSpaceMembers =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
    "\\x{205f}\\x{3000}";

}  // namespace

std::string oniguruma_compatible_regex(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceMembers)
                        : std::string("[") + kWhiteSpaceMembers + "]";
      } else if (e == 'S' && !in_class) {
        out += std::string("[^") + kWhiteSpaceMembers + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal, SplitBehavior behavior,
                             bool invert, const std::string& where)
    : behavior_(behavior), invert_(invert) {
  uint32_t opts = PCRE2_UTF | PCRE2_UCP;
  std::string adapted;
  if (literal) {
    for (char c : pattern) {  // escape every ASCII punctuation character
      if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c)))
        adapted += '\\';
      adapted += c;
    }
  } else {
    adapted = oniguruma_compatible_regex(pattern);
  }
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(adapted.data()), adapted.size(),
                                   opts, &err, &off, nullptr);
  if (!code)
    MT_FAIL("[tokenizer] {}: cannot compile the regex '{}' (as '{}', at offset {}): {}", where,
            pattern, adapted, off, pcre2_message(err));
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool RegexSplitter::next_match(std::string_view text, size_t from, size_t* b, size_t* e) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& st = match_state();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (from < text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, st.data, st.context)
                  : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, st.data,
                                st.context);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    MT_CHECK(rc >= 0, "[tokenizer] regex match failed at byte {} of a {}-byte text: {}", from,
             text.size(), pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    if (ov[1] > ov[0]) {
      *b = ov[0];
      *e = ov[1];
      return true;
    }
    // Empty match: look again from the next code point.
    from = ov[0] + 1;
    while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  }
  return false;
}

}  // namespace moetrain
