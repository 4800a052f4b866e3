// UTF-8 validation/repair, code point helpers and utf8proc-backed normalizers (see
// unicode_text.h). The repair follows the Unicode "maximal subpart" practice so that invalid
// input reads the same as in Rust's String::from_utf8_lossy.
#include "tokenizer/unicode_text.h"

#include <cstdlib>
#include <cstring>

#include <utf8proc.h>

#include "core/check.h"

namespace moetrain {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 with *consumed = length of the maximal
// invalid subpart (>= 1) to replace by one U+FFFD.
size_t valid_sequence_at(std::string_view s, size_t i, size_t* consumed) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b = at(i);
  if (b < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) need = 1;
  else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *consumed = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) break;
    unsigned char c = at(i + k);
    bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) break;
  }
  if (k == need + 1) return need + 1;
  *consumed = k;
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, n = s.size(), consumed = 0;
  while (i < n) {
    // Skip ASCII eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    size_t len = valid_sequence_at(s, i, &consumed);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0, consumed = 0;
  while (i < s.size()) {
    size_t len = valid_sequence_at(s, i, &consumed);
    if (len) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += consumed;
    }
  }
  return out;
}

char32_t prev_code_point(std::string_view s, size_t end, size_t* start) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  *start = b;
  size_t i = b;
  return next_code_point(s, i);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_unicode_whitespace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '_';
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: case UTF8PROC_CATEGORY_MC:
      return true;
    default:
      return false;  // approximation: Other_Alphabetic nonspacing marks are not counted
  }
}

namespace {

// One bit per BMP code point: set when the code point has combining class 0, is its own NFC,
// and is never a non-first element of a canonical decomposition (so nothing composes with
// it). Built once from utf8proc's tables (a few milliseconds).
std::vector<uint64_t> build_nfc_stable_bmp() {
  std::vector<bool> second(0x110000, false);
  utf8proc_int32_t buf[32];
  auto decomposable = [](utf8proc_int32_t c) {
    return utf8proc_get_property(c)->decomp_seqindex != UINT16_MAX ||
           (c >= 0xAC00 && c <= 0xD7A3);  // Hangul syllables decompose algorithmically
  };
  for (utf8proc_int32_t c = 0; c < 0x110000; ++c) {
    if ((c >= 0xD800 && c <= 0xDFFF) || !decomposable(c)) continue;
    int last = 0;
    auto n = utf8proc_decompose_char(c, buf, 32, UTF8PROC_DECOMPOSE, &last);
    for (utf8proc_ssize_t k = 1; k < n; ++k) second[static_cast<size_t>(buf[k])] = true;
  }
  std::vector<uint64_t> bits(0x10000 / 64, 0);
  for (utf8proc_int32_t c = 0; c < 0x10000; ++c) {
    if ((c >= 0xD800 && c <= 0xDFFF) || second[static_cast<size_t>(c)]) continue;
    if (utf8proc_get_property(c)->combining_class != 0) continue;
    if (decomposable(c)) {
      std::string s;
      append_utf8(s, static_cast<char32_t>(c));
      utf8proc_uint8_t* out = nullptr;
      auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                            static_cast<utf8proc_ssize_t>(s.size()), &out,
                            static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      bool same = n == static_cast<utf8proc_ssize_t>(s.size()) &&
                  std::memcmp(out, s.data(), s.size()) == 0;
      std::free(out);
      if (!same) continue;
    }
    bits[static_cast<size_t>(c) / 64] |= 1ull << (c % 64);
  }
  return bits;
}

}  // namespace

bool nfc_stable_fast(char32_t cp) {
  if (cp < 0x300) return true;
  if (cp < 0x10000) {
    static const std::vector<uint64_t> bits = build_nfc_stable_bmp();
    return (bits[cp / 64] >> (cp % 64)) & 1;
  }
  // Emoji and pictographs, and CJK extensions B..H (no decompositions, class 0).
  return (cp >= 0x1F000 && cp <= 0x1FAFF) || (cp >= 0x20000 && cp <= 0x2F7FF) ||
         (cp >= 0x30000 && cp <= 0x323AF);
}

namespace {

bool all_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

bool nfc_already(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0xCC) {  // every code point below U+0300
      ++i;
      continue;
    }
    size_t j = i;
    if (!nfc_stable_fast(next_code_point(s, j))) return false;
    i = j;
  }
  return true;
}

void utf8proc_form(std::string_view in, NormalForm f, std::string& out) {
  int opt = UTF8PROC_STABLE;
  switch (f) {
    case NormalForm::kNFC: opt |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* res = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                        static_cast<utf8proc_ssize_t>(in.size()), &res,
                        static_cast<utf8proc_option_t>(opt));
  MT_CHECK(n >= 0, "[tokenizer] normalization failed: {}", utf8proc_errmsg(n));
  out.assign(reinterpret_cast<const char*>(res), static_cast<size_t>(n));
  std::free(res);
}

}  // namespace

std::string_view Normalizer::apply(std::string_view in, std::string& buf) const {
  std::string_view cur = in;
  std::string tmp;
  for (NormalForm f : forms_) {
    bool unchanged = all_ascii(cur) || (f == NormalForm::kNFC && nfc_already(cur));
    if (unchanged) continue;
    utf8proc_form(cur, f, tmp);
    buf.swap(tmp);
    cur = buf;
  }
  return cur;
}

}  // namespace moetrain
