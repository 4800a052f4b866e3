// Chat templates: renders a tokenizer_config.json `chat_template` (a Jinja subset large enough
// for the Qwen3 and Llama-3 templates, see jinja.h) and derives SFT loss masks from the rendering.
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
  // Extra template variables, e.g. {"enable_thinking": false}, "tools", "bos_token". Ordered so
  // that `tools | tojson` keeps the caller's key order (as Python dicts do); a nlohmann::json
  // assigned here converts implicitly. "tools" and "documents" default to none (as in
  // transformers' apply_chat_template).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Parses the template once; throws moetrain::Error naming the line/column of a syntax error.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  // messages: JSON array of {"role", "content", ...}; variables such as bos_token/eos_token come
  // from `extra` (the caller fills them from the tokenizer). Thread-safe. Pass ordered_json to
  // keep the messages' key order in tojson output (nlohmann::json sorts keys).
  std::string render(const nlohmann::json& messages, const ChatRenderOptions& opt = {}) const;
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& opt = {}) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Token ids and SFT loss mask of one conversation: mask 1 on tokens the assistant generates (its
// content and its end-of-turn token), 0 elsewhere. bos_token/eos_token are filled from `tok`
// unless `opt.extra` has them. Method: see chat_template.cpp.
struct MaskedTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};
MaskedTokens tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                           const nlohmann::json& messages, const ChatRenderOptions& opt = {});
MaskedTokens tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                           const nlohmann::ordered_json& messages, const ChatRenderOptions& opt = {});

// Character spans [begin, end) of the rendered conversation that the assistant generates (the
// part of tokenize_chat that needs no tokenizer); `end_of_turn` is the token that closes an
// assistant turn, e.g. "<|im_end|>" (find_end_of_turn derives it with a probe conversation).
struct AssistantSpan {
  size_t begin, end;
};
struct RenderedChat {
  std::string text;
  std::vector<AssistantSpan> spans;
};
RenderedChat render_with_assistant_spans(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& opt, const std::string& end_of_turn);
std::string find_end_of_turn(const Tokenizer& tok, const ChatTemplate& tmpl, const ChatRenderOptions& opt);

}  // namespace moetrain
