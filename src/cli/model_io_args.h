// Helpers shared by the init and export commands: byte sizes like "5GB" (10^9, as transformers'
// max_shard_size), "500MB", "2GiB" (2^30) or a plain number of bytes.
#pragma once
#include <cctype>
#include <cstdint>
#include <string>

#include "core/check.h"

namespace moetrain::cli {

inline uint64_t parse_byte_size(const std::string& s, const char* option) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  MT_CHECK(i > 0, "[cli] {} '{}' is not a size like 5GB, 500MB or 1000000", option, s);
  double v = 0;
  try {
    v = std::stod(s.substr(0, i));
  } catch (...) {
    MT_FAIL("[cli] {} '{}' is not a size like 5GB, 500MB or 1000000", option, s);
  }
  std::string unit = s.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mul = 0;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else if (unit == "KIB") mul = 1024.0;
  else if (unit == "MIB") mul = 1024.0 * 1024;
  else if (unit == "GIB") mul = 1024.0 * 1024 * 1024;
  MT_CHECK(mul > 0, "[cli] {} '{}': unknown unit '{}' (use B, KB, MB, GB, KiB, MiB or GiB)", option, s, unit);
  MT_CHECK(v * mul >= 1, "[cli] {} '{}' must be at least one byte", option, s);
  return static_cast<uint64_t>(v * mul);
}

}  // namespace moetrain::cli
