// RecordEncoder backed by the real tokenizer and its chat template. Kept in its own file so that
// code and tests using a stand-in encoder do not link the tokenizer implementation.
#include "core/check.h"
#include "data/prepare.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moetrain {
namespace {

class TokenizerEncoder final : public RecordEncoder {
 public:
  TokenizerEncoder(const Tokenizer& tok, const nlohmann::json& template_args) : tok_(tok) {
    if (!tok.chat_template().empty()) tmpl_ = std::make_unique<ChatTemplate>(tok.chat_template());
    opt_.extra = template_args.is_object() ? template_args : nlohmann::json::object();
    // Templates refer to these by name; the caller-provided arguments win.
    if (tok.bos_id() >= 0 && !opt_.extra.contains("bos_token")) opt_.extra["bos_token"] = tok.id_to_token(tok.bos_id());
    if (tok.eos_id() >= 0 && !opt_.extra.contains("eos_token")) opt_.extra["eos_token"] = tok.id_to_token(tok.eos_id());
  }
  std::vector<int32_t> encode_text(std::string_view text) const override { return tok_.encode(text); }
  MaskedTokens encode_chat(const nlohmann::json& messages) const override {
    MT_CHECK(tmpl_ != nullptr, "[prepare] tokenizer in {} has no chat_template", tok_.directory());
    return tokenize_chat(tok_, *tmpl_, messages, opt_);
  }
  bool has_chat_template() const override { return tmpl_ != nullptr; }
  int32_t eos_id() const override { return tok_.eos_id(); }
  int64_t vocab_size() const override { return tok_.vocab_size(); }

 private:
  const Tokenizer& tok_;
  std::unique_ptr<ChatTemplate> tmpl_;
  ChatRenderOptions opt_;
};

}  // namespace

std::unique_ptr<RecordEncoder> make_tokenizer_encoder(const Tokenizer& tok, const nlohmann::json& template_args) {
  return std::make_unique<TokenizerEncoder>(tok, template_args);
}

}  // namespace moetrain
