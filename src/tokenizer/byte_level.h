// The GPT-2 byte-to-unicode map used by byte-level BPE: the 188 printable bytes ('!'..'~',
// 0xA1..0xAC, 0xAE..0xFF) stand for themselves, the other 68 bytes map in order to U+0100..U+0143,
// so every byte string becomes a printable string of vocabulary characters.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace moetrain {

class ByteLevelMap {
 public:
  ByteLevelMap() {
    int extra = 0;
    unicode_to_byte_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      byte_to_unicode_[b] = cp;
      unicode_to_byte_[cp] = static_cast<int16_t>(b);
      std::string& u = utf8_[b];
      if (cp < 0x80) {
        u = std::string(1, static_cast<char>(cp));
      } else {
        u += static_cast<char>(0xC0 | (cp >> 6));
        u += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
  }
  char32_t to_unicode(uint8_t b) const { return byte_to_unicode_[b]; }
  // -1 when `cp` is not one of the 256 alphabet characters.
  int to_byte(char32_t cp) const { return cp < kSpan ? unicode_to_byte_[cp] : -1; }
  const std::string& utf8(uint8_t b) const { return utf8_[b]; }  // the mapped char as UTF-8
  // Appends the mapped form of `bytes` (the way vocabulary entries are spelled).
  void map(std::string_view bytes, std::string& out) const {
    for (unsigned char b : bytes) out += utf8_[b];
  }

 private:
  static constexpr char32_t kSpan = 256 + 68;
  std::array<char32_t, 256> byte_to_unicode_{};
  std::array<int16_t, kSpan> unicode_to_byte_{};
  std::array<std::string, 256> utf8_;
};

}  // namespace moetrain
