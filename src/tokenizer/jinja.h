// A Jinja2 subset sufficient for Hugging Face chat templates (Qwen3, Llama-3/3.1, ChatML...):
// text, {{ }}, {% %}, {# #}, whitespace control, if/for/set/macro/namespace, filters, tests,
// Python str/list/dict methods, slicing and raise_exception(). Semantics follow Python Jinja2 as
// transformers configures it (trim_blocks, lstrip_blocks, loopcontrols, json.dumps tojson).
#pragma once
#include <memory>
#include <string>

#include "tokenizer/jinja_value.h"

namespace moetrain::jinja {

struct Options {
  bool trim_blocks = true;    // drop the first newline after a {% %} / {# #} tag
  bool lstrip_blocks = true;  // drop spaces/tabs before a {% %} / {# #} tag at a line's start
  bool keep_trailing_newline = false;
};

struct Program;  // parsed template (jinja_ast.h)

class Template {
 public:
  // Parses `source`; a syntax error throws moetrain::Error "[<name>] line L, column C: ...".
  explicit Template(const std::string& source, const std::string& name = "chat_template",
                    const Options& opt = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `vars` as the global variables (messages, add_generation_prompt, tools...).
  // Thread-safe (a render owns all its state). Runtime errors and raise_exception() throw
  // moetrain::Error naming the template line and column and what failed.
  std::string render(const ValueDict& vars) const;

 private:
  std::unique_ptr<Program> program_;
  std::string name_;
};

}  // namespace moetrain::jinja
