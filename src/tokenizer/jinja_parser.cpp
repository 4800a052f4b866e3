// Recursive-descent parser of the chat-template Jinja subset (tokens from jinja_lexer.cpp).
// Operator precedence follows Jinja2's parser (condexpr < or < and < not < compare < +,- <
// ~ < *,/,//,% < ** < unary < postfix/filter/test).
#include <cstring>
#include <initializer_list>

#include "core/check.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace moetrain::jinja {

std::pair<int, int> Program::line_col(size_t pos) const {
  int line = 1, col = 1;
  for (size_t k = 0; k < pos && k < source.size(); ++k) {
    if (source[k] == '\n') { ++line; col = 1; }
    else ++col;
  }
  return {line, col};
}

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, const Program& prog, const std::string& name)
      : toks_(std::move(toks)), prog_(prog), name_(name) {}

  Body parse_template() {
    std::string ended;
    Body b = parse_body({}, &ended, 0);
    return b;
  }

 private:
  const Token& cur() const { return toks_[k_]; }
  const Token& peek(size_t d = 1) const { return toks_[std::min(k_ + d, toks_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* nm) const { return cur().type == Tok::kName && cur().text == nm; }
  bool skip_op(const char* op) { if (is_op(op)) { ++k_; return true; } return false; }
  bool skip_name(const char* nm) { if (is_name(nm)) { ++k_; return true; } return false; }

  [[noreturn]] void error(size_t pos, const std::string& msg) const {
    auto [l, c] = prog_.line_col(pos);
    MT_FAIL("[{}] syntax error at line {}, column {}: {}", name_, l, c, msg);
  }
  std::string describe(const Token& t) const {
    if (t.type == Tok::kName || t.type == Tok::kOp) return "'" + t.text + "'";
    return tok_desc(t.type);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur().pos, std::string("expected '") + op + "', got " + describe(cur()));
  }
  void expect(Tok t) {
    if (cur().type != t) error(cur().pos, std::string("expected ") + tok_desc(t) + ", got " + describe(cur()));
    ++k_;
  }
  std::string expect_name(const char* what) {
    if (cur().type != Tok::kName) error(cur().pos, std::string("expected ") + what + ", got " + describe(cur()));
    return toks_[k_++].text;
  }

  // Parses statements until a block tag named in `ends`; consumes "{%" and that name and
  // stores it in *ended. `open_pos` is the opening tag, named in "missing end tag" errors.
  Body parse_body(std::initializer_list<const char*> ends, std::string* ended, size_t open_pos) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEnd) {
        if (ends.size() == 0) return body;
        error(open_pos, std::string("this block is never closed (expected {% ") + *(ends.end() - 1) + " %})");
      }
      if (t.type == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->type = StmtType::kText;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        ++k_;
      } else if (t.type == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->type = StmtType::kOutput;
        s->pos = t.pos;
        ++k_;
        s->expr = parse_tuple_expr();
        expect(Tok::kVarEnd);
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        const Token& nm = peek();
        if (nm.type != Tok::kName) error(nm.pos, "expected a statement name after '{%', got " + describe(nm));
        for (const char* e : ends) {
          if (nm.text == e) {
            k_ += 2;
            *ended = e;
            return body;
          }
        }
        body.push_back(parse_statement());
      } else {
        error(t.pos, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    size_t pos = cur().pos;
    ++k_;  // "{%"
    const Token& nm = cur();
    std::string kw = nm.text;
    ++k_;
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    std::string ended;
    if (kw == "if") {
      s->type = StmtType::kIf;
      ExprPtr cond = parse_tuple_expr();
      expect(Tok::kBlockEnd);
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, &ended, pos);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (ended == "elif") {
          cond = parse_tuple_expr();
          expect(Tok::kBlockEnd);
          continue;
        }
        if (ended == "else") {
          expect(Tok::kBlockEnd);
          s->else_body = parse_body({"endif"}, &ended, pos);
        }
        break;
      }
      expect(Tok::kBlockEnd);
    } else if (kw == "for") {
      s->type = StmtType::kFor;
      bool paren = skip_op("(");
      do {
        s->targets.push_back(expect_name("a loop variable name"));
      } while (skip_op(","));
      if (paren) expect_op(")");
      if (!skip_name("in")) error(cur().pos, "expected 'in' after the loop variable, got " + describe(cur()));
      s->expr = parse_tuple_expr(/*with_cond=*/false);
      if (skip_name("if")) s->cond = parse_expression();
      if (is_name("recursive")) error(cur().pos, "recursive loops are not supported");
      expect(Tok::kBlockEnd);
      s->body = parse_body({"else", "endfor"}, &ended, pos);
      if (ended == "else") {
        expect(Tok::kBlockEnd);
        s->else_body = parse_body({"endfor"}, &ended, pos);
      }
      expect(Tok::kBlockEnd);
    } else if (kw == "set") {
      s->targets.push_back(expect_name("a variable name"));
      if (skip_op(".")) {
        s->attr_target = true;
        s->targets.push_back(expect_name("an attribute name"));
      } else {
        while (skip_op(",")) s->targets.push_back(expect_name("a variable name"));
      }
      if (skip_op("=")) {
        s->type = StmtType::kSet;
        s->expr = parse_tuple_expr();
        expect(Tok::kBlockEnd);
      } else {
        s->type = StmtType::kSetBlock;
        if (s->targets.size() > 1 && !s->attr_target) error(pos, "a block set takes one variable");
        expect(Tok::kBlockEnd);
        s->body = parse_body({"endset"}, &ended, pos);
        expect(Tok::kBlockEnd);
      }
    } else if (kw == "macro") {
      s->type = StmtType::kMacro;
      s->name = expect_name("a macro name");
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name("a parameter name");
        ExprPtr def;
        if (skip_op("=")) def = parse_expression();
        s->params.emplace_back(p, std::move(def));
        if (!skip_op(",")) break;
      }
      expect_op(")");
      expect(Tok::kBlockEnd);
      s->body = parse_body({"endmacro"}, &ended, pos);
      if (cur().type == Tok::kName) ++k_;  // {% endmacro name %}
      expect(Tok::kBlockEnd);
    } else if (kw == "break" || kw == "continue") {
      s->type = kw == "break" ? StmtType::kBreak : StmtType::kContinue;
      expect(Tok::kBlockEnd);
    } else if (kw == "filter") {
      s->type = StmtType::kFilterBlock;
      // Stored as a filter expression applied to a placeholder operand (children[0] == null).
      auto f = std::make_unique<Expr>();
      f->type = ExprType::kFilter;
      f->pos = cur().pos;
      f->name = expect_name("a filter name");
      f->children.push_back(nullptr);
      if (is_op("(")) parse_call_args(*f);
      s->cond = std::move(f);
      expect(Tok::kBlockEnd);
      s->body = parse_body({"endfilter"}, &ended, pos);
      expect(Tok::kBlockEnd);
    } else if (kw == "generation") {
      // transformers' {% generation %} marks assistant text; it renders its body unchanged.
      s->type = StmtType::kBlock;
      expect(Tok::kBlockEnd);
      s->body = parse_body({"endgeneration"}, &ended, pos);
      expect(Tok::kBlockEnd);
    } else {
      error(nm.pos, "unknown or misplaced statement '" + kw + "'");
    }
    return s;
  }

  ExprPtr make(ExprType t, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->type = t;
    e->pos = pos;
    return e;
  }

  // expr ("," expr)* -> a tuple when a comma appears.
  ExprPtr parse_tuple_expr(bool with_cond = true) {
    size_t pos = cur().pos;
    ExprPtr first = with_cond ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto t = make(ExprType::kTuple, pos);
    t->children.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || is_op(")")) break;
      t->children.push_back(with_cond ? parse_expression() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      size_t pos = cur().pos;
      ++k_;
      auto c = make(ExprType::kCond, pos);
      ExprPtr test = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_expression();
      c->children.push_back(std::move(test));
      c->children.push_back(std::move(e));
      c->children.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto b = make(ExprType::kOr, cur().pos);
      ++k_;
      b->children.push_back(std::move(e));
      b->children.push_back(parse_and());
      e = std::move(b);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto b = make(ExprType::kAnd, cur().pos);
      ++k_;
      b->children.push_back(std::move(e));
      b->children.push_back(parse_not());
      e = std::move(b);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto n = make(ExprType::kNot, cur().pos);
      ++k_;
      n->children.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    size_t pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++k_;
      } else if (is_name("in")) {
        op = "in";
        ++k_;
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "not in";
        k_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprType::kCompare, pos);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr binary(ExprPtr l, const std::string& op, size_t pos, ExprPtr r) {
    auto b = make(ExprType::kBinary, pos);
    b->name = op;
    b->children.push_back(std::move(l));
    b->children.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      size_t pos = cur().pos;
      ++k_;
      e = binary(std::move(e), op, pos, parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      size_t pos = cur().pos;
      ++k_;
      e = binary(std::move(e), "~", pos, parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      size_t pos = cur().pos;
      ++k_;
      e = binary(std::move(e), op, pos, parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      size_t pos = cur().pos;
      ++k_;
      e = binary(std::move(e), "**", pos, parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? ExprType::kNeg : ExprType::kPos, cur().pos);
      ++k_;
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_test(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        ++k_;
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.pos);
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.pos);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.pos);
        auto e = make(ExprType::kName, t.pos);
        e->name = t.text;
        return e;
      }
      case Tok::kString: {
        std::string s;
        size_t pos = t.pos;
        while (cur().type == Tok::kString) s += toks_[k_++].text;  // "a" "b" concatenates
        return literal(Value::string(std::move(s)), pos);
      }
      case Tok::kInt: {
        ++k_;
        try {
          return literal(Value::integer(std::stoll(t.text)), t.pos);
        } catch (const std::exception&) {
          return literal(Value::number(std::stod(t.text)), t.pos);
        }
      }
      case Tok::kFloat: ++k_; return literal(Value::number(std::stod(t.text)), t.pos);
      case Tok::kOp: {
        if (t.text == "(") {
          size_t pos = t.pos;
          ++k_;
          if (skip_op(")")) {
            auto e = make(ExprType::kTuple, pos);
            return e;
          }
          ExprPtr e = parse_expression();
          if (is_op(",")) {
            auto tup = make(ExprType::kTuple, pos);
            tup->children.push_back(std::move(e));
            while (skip_op(",")) {
              if (is_op(")")) break;
              tup->children.push_back(parse_expression());
            }
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = make(ExprType::kList, t.pos);
          ++k_;
          while (!is_op("]")) {
            e->children.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          auto e = make(ExprType::kDict, t.pos);
          ++k_;
          while (!is_op("}")) {
            e->children.push_back(parse_expression());
            expect_op(":");
            e->children.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("}");
          return e;
        }
        break;
      }
      default: break;
    }
    error(t.pos, "unexpected " + describe(t) + " in an expression");
  }

  ExprPtr literal(Value v, size_t pos) {
    auto e = make(ExprType::kLiteral, pos);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        size_t pos = cur().pos;
        ++k_;
        if (cur().type == Tok::kInt) {
          auto g = make(ExprType::kGetItem, pos);
          g->children.push_back(std::move(e));
          g->children.push_back(literal(Value::integer(std::stoll(cur().text)), cur().pos));
          ++k_;
          e = std::move(g);
          continue;
        }
        auto g = make(ExprType::kGetAttr, pos);
        g->name = expect_name("an attribute name after '.'");
        g->children.push_back(std::move(e));
        e = std::move(g);
      } else if (is_op("[")) {
        size_t pos = cur().pos;
        ++k_;
        e = parse_subscript(std::move(e), pos);
      } else if (is_op("(")) {
        auto c = make(ExprType::kCall, cur().pos);
        c->children.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, size_t pos) {
    ExprPtr parts[3];
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression();
    while (colons < 2 && skip_op(":")) {
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression();
    }
    expect_op("]");
    if (colons == 0) {
      auto g = make(ExprType::kGetItem, pos);
      g->children.push_back(std::move(obj));
      g->children.push_back(std::move(parts[0]));
      return g;
    }
    auto s = make(ExprType::kSlice, pos);
    s->children.push_back(std::move(obj));
    for (auto& p : parts) s->children.push_back(std::move(p));
    return s;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = cur().text;
        k_ += 2;
        call.kwargs.emplace_back(key, parse_expression());
      } else {
        if (!call.kwargs.empty()) error(cur().pos, "positional argument follows keyword argument");
        call.children.push_back(parse_expression());
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_filter_test(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        ++k_;
        auto f = make(ExprType::kFilter, cur().pos);
        f->name = expect_name("a filter name after '|'");
        f->children.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++k_;
        bool neg = skip_name("not");
        auto t = make(ExprType::kTest, cur().pos);
        t->negate = neg;
        t->name = expect_name("a test name after 'is'");
        t->children.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                    cur().type == Tok::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("not") && !is_name("is")) {
          t->children.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t k_ = 0;
  const Program& prog_;
  const std::string& name_;
};

}  // namespace

std::unique_ptr<Program> parse_program(const std::string& source, const std::string& name,
                                       bool trim_blocks, bool lstrip_blocks, bool keep_trailing_newline) {
  auto prog = std::make_unique<Program>();
  prog->source = source;
  if (!keep_trailing_newline) {
    if (prog->source.size() >= 2 && prog->source.compare(prog->source.size() - 2, 2, "\r\n") == 0)
      prog->source.resize(prog->source.size() - 2);
    else if (!prog->source.empty() && prog->source.back() == '\n')
      prog->source.pop_back();
  }
  Parser parser(lex_template(*prog, name, trim_blocks, lstrip_blocks), *prog, name);
  prog->body = parser.parse_template();
  return prog;
}

}  // namespace moetrain::jinja
