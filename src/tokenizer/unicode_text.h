// UTF-8 helpers for the tokenizer: validation and lossy repair (one U+FFFD per maximal invalid
// subpart, as Rust's String::from_utf8_lossy), code point decoding, the Unicode White_Space and
// alphanumeric tests HF uses for added-token flags, and the normalizers (NFC/NFD/NFKC/NFKD via
// utf8proc, or a sequence of them).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moetrain {

bool is_valid_utf8(std::string_view s);
std::string repair_utf8(std::string_view s);  // every invalid subpart becomes U+FFFD

// Decodes the code point starting at s[i] of a valid UTF-8 string; advances i.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) { ++i; return b; }
  int n = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
  char32_t cp = b & (0x3F >> n);
  for (int k = 0; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + 1 + k]) & 0x3F);
  i += n + 1;
  return cp;
}
// The code point that ends at s[end) (valid UTF-8, end > 0); sets `start` to its first byte.
char32_t prev_code_point(std::string_view s, size_t end, size_t* start);
void append_utf8(std::string& out, char32_t cp);

bool is_unicode_whitespace(char32_t c);   // Rust char::is_whitespace (White_Space property)
bool is_word_char(char32_t c);            // Rust is_alphanumeric() or '_' (via categories)

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

// A chain of Unicode normal forms applied in order; empty means the identity.
class Normalizer {
 public:
  void add(NormalForm f) { forms_.push_back(f); }
  bool empty() const { return forms_.empty(); }
  // Returns `in` itself when no form changes it (fast paths for text made only of code points
  // that are stable under the form), otherwise the normalized text stored in `buf`.
  std::string_view apply(std::string_view in, std::string& buf) const;

 private:
  std::vector<NormalForm> forms_;
};

// True when `cp` is unchanged by NFC and has combining class 0, so a string made only of such
// code points is already NFC. Exposed for the unit test that checks the table with utf8proc.
bool nfc_stable_fast(char32_t cp);

}  // namespace moetrain
