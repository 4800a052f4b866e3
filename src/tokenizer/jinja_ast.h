// Internal syntax tree of the chat-template Jinja engine (jinja_parser.cpp builds it,
// jinja_eval.cpp walks it). Every node keeps its byte offset in the source so errors can name
// the template line and column.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace moetrain::jinja {

enum class ExprType : uint8_t {
  kLiteral, kName, kList, kTuple, kDict, kGetAttr, kGetItem, kSlice, kCall, kFilter, kTest,
  kNeg, kPos, kNot, kBinary, kAnd, kOr, kCompare, kCond
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprType type;
  size_t pos = 0;
  Value literal;                  // kLiteral
  std::string name;               // kName, kGetAttr attribute, kCall/kFilter/kTest name, kBinary op
  std::vector<ExprPtr> children;  // operands; kSlice: object, start, stop, step (may be null)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall/kFilter/kTest keyword arguments
  std::vector<std::string> ops;   // kCompare: operators between children
  bool negate = false;            // kTest: "is not"
};

enum class StmtType : uint8_t {
  kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kFilterBlock, kBlock
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtType type;
  size_t pos = 0;
  std::string text;                                 // kText
  ExprPtr expr;                                     // kOutput/kSet value; kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;   // kIf: (condition, body) for if/elif
  Body body, else_body;                             // kFor, kSetBlock, kMacro, kFilterBlock
  std::vector<std::string> targets;                 // kFor/kSet names; ns.attr: {ns, attr}
  bool attr_target = false;                         // kSet/kSetBlock into ns.attr
  ExprPtr cond;                                     // kFor "if" filter; kFilterBlock filter call
  std::string name;                                 // kMacro name
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro parameters and defaults
};

struct Program {
  std::string source;
  Body body;
  // 1-based line and column of a byte offset (column counts bytes).
  std::pair<int, int> line_col(size_t pos) const;
};

std::unique_ptr<Program> parse_program(const std::string& source, const std::string& name,
                                       bool trim_blocks, bool lstrip_blocks, bool keep_trailing_newline);

}  // namespace moetrain::jinja
