// Label conventions shared by the data loader, the model and the objectives.
#pragma once
#include <cstdint>

namespace moetrain {

// A label that trains nothing (padding, a document's last token, masked prompt tokens); the same
// value as transformers' ignore_index.
constexpr int32_t kIgnoreLabel = -100;

}  // namespace moetrain
