// Glob and regex matching of parameter names (see name_pattern.h). Globs go through fnmatch(3)
// without FNM_PATHNAME, so '*' matches any run of characters including '.'.
#include "optim/name_pattern.h"

#include <fnmatch.h>

#include <regex>

#include "core/check.h"

namespace moetrain {

namespace {
constexpr const char* kRegexPrefix = "re:";
bool is_regex(const std::string& p) { return p.rfind(kRegexPrefix, 0) == 0; }
}  // namespace

bool name_matches(const std::string& pattern, const std::string& name) {
  if (is_regex(pattern)) {
    const std::regex re(pattern.substr(3), std::regex::ECMAScript);
    return std::regex_match(name, re);
  }
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

bool name_matches_any(const std::vector<std::string>& patterns, const std::string& name) {
  for (const auto& p : patterns)
    if (name_matches(p, name)) return true;
  return false;
}

void validate_name_pattern(const std::string& pattern, const std::string& key) {
  MT_CHECK(!pattern.empty(), "[config] {} holds an empty pattern", key);
  if (!is_regex(pattern)) return;
  try {
    std::regex re(pattern.substr(3), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    MT_FAIL("[config] {}: regular expression '{}' does not compile: {}", key, pattern.substr(3), e.what());
  }
}

}  // namespace moetrain
