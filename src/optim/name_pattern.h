// Parameter-name patterns for freezing and weight-decay exclusions: a glob ("*.mlp.gate.weight",
// '*' also crosses dots) or, with the prefix "re:", an ECMAScript regular expression that must
// match the whole name ("re:model\.layers\.[0-3]\..*").
#pragma once
#include <string>
#include <vector>

namespace moetrain {

bool name_matches(const std::string& pattern, const std::string& name);
bool name_matches_any(const std::vector<std::string>& patterns, const std::string& name);
// Throws naming the pattern when a regex does not compile.
void validate_name_pattern(const std::string& pattern, const std::string& key);

}  // namespace moetrain
