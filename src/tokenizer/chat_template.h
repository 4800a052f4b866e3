// Chat templates: renders a tokenizer_config.json `chat_template` (a Jinja subset large enough
// for the Qwen3 and Llama-3 templates) and derives SFT loss masks from the rendering.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moetrain {

class Tokenizer;

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  nlohmann::json extra = nlohmann::json::object();  // e.g. {"enable_thinking": false}, tools
};

class ChatTemplate {
 public:
  // Parses the template once; throws moetrain::Error naming the line/column of a syntax error.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  // messages: JSON array of {"role", "content", ...}; variables such as bos_token/eos_token come
  // from `extra` (the caller fills them from the tokenizer).
  std::string render(const nlohmann::json& messages, const ChatRenderOptions& opt = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Token ids and SFT loss mask of one conversation: mask 1 on tokens the assistant generates (its
// content and its end-of-turn token), 0 elsewhere.
struct MaskedTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};
MaskedTokens tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                           const nlohmann::json& messages, const ChatRenderOptions& opt = {});

}  // namespace moetrain
