// Lexer of the chat-template Jinja subset: splits a template into text and the tokens inside
// {{ }} / {% %}, applying whitespace control ("-" strips all whitespace on that side,
// trim_blocks drops one newline after a block/comment tag, lstrip_blocks drops spaces/tabs
// between a line start and a block/comment tag) and dropping comments; raw blocks become text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/jinja_ast.h"

namespace moetrain::jinja {

enum class Tok : uint8_t { kText, kBlockBegin, kBlockEnd, kVarBegin, kVarEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type;
  std::string text;  // text, name, operator or the decoded string literal
  size_t pos;        // byte offset in Program::source
};

const char* tok_desc(Tok t);
// Throws moetrain::Error "[<name>] syntax error at line L, column C: ..." on bad input.
std::vector<Token> lex_template(const Program& prog, const std::string& name, bool trim_blocks, bool lstrip_blocks);

}  // namespace moetrain::jinja
