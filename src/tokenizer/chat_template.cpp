// ChatTemplate (a jinja::Template rendering {messages, add_generation_prompt, tools, ...}) and
// the SFT loss masks of tokenize_chat.
//
// Mask method (prefix rendering, no template changes needed): for each assistant message i,
// render messages[:i] with add_generation_prompt=true. That text is the prompt the model sees
// before it generates turn i, so where it matches the start of the full rendering, the
// assistant's span begins right after it (Llama-3 and Qwen3 both satisfy this). Templates that
// rewrite history (Qwen3 drops <think> blocks of earlier turns; its non-thinking generation
// prompt adds an empty think block) can make the prefix differ from the full text; then the
// span starts after the last newline the two share (the end of the "<|im_start|>assistant\n"
// header). The span ends after the first end-of-turn token (e.g. <|im_end|>, <|eot_id|>) at or
// after its start; that token is learned from a probe conversation, as the first token the
// template emits after an assistant message's content. Each span and each gap is tokenized on
// its own, which is also how a prompt and a generated continuation are tokenized at inference.
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "tokenizer/jinja.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/tokenizer.h"

namespace moetrain {

using jinja::Value;

struct ChatTemplate::Impl {
  jinja::Template tmpl;
  explicit Impl(const std::string& src) : tmpl(src, "chat_template") {}

  std::string render(const Value& messages, bool add_generation_prompt, const jinja::ValueDict& extra) const {
    jinja::ValueDict vars = extra;
    if (!vars.find("tools")) vars.set("tools", Value::none());
    if (!vars.find("documents")) vars.set("documents", Value::none());
    vars.set("messages", messages);
    vars.set("add_generation_prompt", Value::boolean(add_generation_prompt));
    return tmpl.render(vars);
  }
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>(source)) {}
ChatTemplate::~ChatTemplate() = default;

namespace {

jinja::ValueDict extra_vars(const ChatRenderOptions& opt) {
  MT_CHECK(opt.extra.is_object() || opt.extra.is_null(), "[chat_template] extra template variables must be a JSON object, got {}",
           opt.extra.type_name());
  jinja::ValueDict d;
  if (opt.extra.is_object()) d = *jinja::from_json(opt.extra).dict;
  return d;
}

template <typename Json>
Value messages_value(const Json& messages) {
  MT_CHECK(messages.is_array(), "[chat_template] messages must be a JSON array, got {}", messages.type_name());
  return jinja::from_json(messages);
}

Value prefix_of(const Value& messages, size_t n) {
  return Value::new_list(jinja::ValueList(messages.list->begin(), messages.list->begin() + long(n)));
}

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t n = std::min(a.size(), b.size()), k = 0;
  while (k < n && a[k] == b[k]) ++k;
  return k;
}

RenderedChat spans_impl(const ChatTemplate::Impl& impl, const Value& msgs, const ChatRenderOptions& opt,
                        const jinja::ValueDict& extra, const std::string& eot) {
  RenderedChat rc;
  rc.text = impl.render(msgs, opt.add_generation_prompt, extra);
  const std::string& full = rc.text;
  size_t floor = 0;
  for (size_t i = 0; i < msgs.list->size(); ++i) {
    const Value& m = (*msgs.list)[i];
    Value role = m.is_dict() ? jinja::get_item(m, Value::string("role")) : Value();
    if (!role.is_string() || role.s != "assistant") continue;
    std::string prompt;
    try {
      prompt = impl.render(prefix_of(msgs, i), true, extra);
    } catch (const Error& e) {
      MT_FAIL("[chat_template] cannot render the conversation before assistant message {} (needed for the loss "
              "mask): {}", i, e.what());
    }
    size_t start;
    if (prompt.size() <= full.size() && full.compare(0, prompt.size(), prompt) == 0) {
      start = prompt.size();
    } else {
      size_t shared = common_prefix(prompt, full);
      start = shared;
      while (start > floor && full[start - 1] != '\n') --start;
      if (start <= floor) start = shared;
    }
    MT_CHECK(start >= floor, "[chat_template] assistant message {} starts at character {}, inside the previous "
             "assistant turn (ending at {}): the template does not render this conversation turn by turn",
             i, start, floor);
    MT_CHECK(!eot.empty(), "[chat_template] cannot tell which token ends an assistant turn in this template");
    size_t f = full.find(eot, start);
    MT_CHECK(f != std::string::npos, "[chat_template] no end-of-turn token '{}' after assistant message {} "
             "(rendered from character {})", eot, i, start);
    rc.spans.push_back({start, f + eot.size()});
    floor = f + eot.size();
  }
  return rc;
}

std::string end_of_turn_impl(const Tokenizer& tok, const ChatTemplate::Impl& impl, const jinja::ValueDict& extra) {
  static const char* kUser = "MTPROBEUSERTEXT";
  static const char* kAssistant = "MTPROBEASSISTANTTEXT";
  static const char* kNext = "MTPROBENEXTTEXT";
  auto msg = [](const char* role, const char* content) {
    Value m = Value::new_dict();
    m.dict->set("role", Value::string(role));
    m.dict->set("content", Value::string(content));
    return m;
  };
  std::vector<jinja::ValueList> probes = {
      {msg("user", kUser), msg("assistant", kAssistant), msg("user", kNext)},
      {msg("system", kNext), msg("user", kUser), msg("assistant", kAssistant), msg("user", kNext)},
      {msg("user", kUser), msg("assistant", kAssistant)},
  };
  for (auto& p : probes) {
    std::string text;
    try {
      text = impl.render(Value::new_list(p), false, extra);
    } catch (const Error&) {
      continue;  // e.g. a template that insists on a system message; try the next probe
    }
    size_t a = text.find(kAssistant);
    if (a == std::string::npos) continue;
    std::string tail = text.substr(a + std::strlen(kAssistant));
    size_t nxt = tail.find(kNext);
    if (nxt != std::string::npos) tail.resize(nxt);
    std::vector<int32_t> ids = tok.encode(tail);
    if (ids.empty()) continue;
    for (std::string cand : {tok.decode({ids[0]}), tok.id_to_token(ids[0])}) {
      bool blank = std::all_of(cand.begin(), cand.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t'; });
      if (!cand.empty() && !blank && tail.compare(0, cand.size(), cand) == 0) return cand;
    }
  }
  return "";
}

jinja::ValueDict extra_with_tokens(const Tokenizer& tok, const ChatRenderOptions& opt) {
  jinja::ValueDict extra = extra_vars(opt);
  if (!extra.find("bos_token") && tok.bos_id() >= 0) extra.set("bos_token", Value::string(tok.id_to_token(tok.bos_id())));
  if (!extra.find("eos_token") && tok.eos_id() >= 0) extra.set("eos_token", Value::string(tok.id_to_token(tok.eos_id())));
  return extra;
}

MaskedTokens tokenize_impl(const Tokenizer& tok, const ChatTemplate& tmpl, const Value& msgs,
                           const ChatRenderOptions& opt) {
  jinja::ValueDict extra = extra_with_tokens(tok, opt);
  std::string eot = end_of_turn_impl(tok, tmpl.impl(), extra);
  RenderedChat rc = spans_impl(tmpl.impl(), msgs, opt, extra, eot);
  MaskedTokens out;
  auto append = [&](size_t b, size_t e, uint8_t mask) {
    if (e <= b) return;
    std::vector<int32_t> ids = tok.encode(std::string_view(rc.text).substr(b, e - b));
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.mask.insert(out.mask.end(), ids.size(), mask);
  };
  size_t pos = 0;
  for (auto& s : rc.spans) {
    append(pos, s.begin, 0);
    append(s.begin, s.end, 1);
    pos = s.end;
  }
  append(pos, rc.text.size(), 0);
  return out;
}

}  // namespace

std::string ChatTemplate::render(const nlohmann::json& messages, const ChatRenderOptions& opt) const {
  return impl_->render(messages_value(messages), opt.add_generation_prompt, extra_vars(opt));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatRenderOptions& opt) const {
  return impl_->render(messages_value(messages), opt.add_generation_prompt, extra_vars(opt));
}

RenderedChat render_with_assistant_spans(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& opt, const std::string& end_of_turn) {
  return spans_impl(tmpl.impl(), messages_value(messages), opt, extra_vars(opt), end_of_turn);
}

std::string find_end_of_turn(const Tokenizer& tok, const ChatTemplate& tmpl, const ChatRenderOptions& opt) {
  return end_of_turn_impl(tok, tmpl.impl(), extra_with_tokens(tok, opt));
}

MaskedTokens tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl, const nlohmann::json& messages,
                           const ChatRenderOptions& opt) {
  return tokenize_impl(tok, tmpl, messages_value(messages), opt);
}

MaskedTokens tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                           const ChatRenderOptions& opt) {
  return tokenize_impl(tok, tmpl, messages_value(messages), opt);
}

}  // namespace moetrain
