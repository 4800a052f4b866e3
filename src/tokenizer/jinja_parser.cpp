// Lexer and recursive-descent parser of the chat-template Jinja subset. Whitespace control
// follows Jinja2: "-" strips all whitespace on that side, trim_blocks drops one newline after a
// block/comment tag, lstrip_blocks drops spaces/tabs between a line start and a block/comment
// tag. Operator precedence follows Jinja2's parser (condexpr < or < and < not < compare < +,- <
// ~ < *,/,//,% < ** < unary < postfix/filter/test).
#include <cstring>
#include <initializer_list>

#include "core/check.h"
#include "tokenizer/jinja_ast.h"

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

enum class Tok : uint8_t { kText, kBlockBegin, kBlockEnd, kVarBegin, kVarEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type;
  std::string text;
  size_t pos;
};

const char* tok_desc(Tok t) {
  switch (t) {
    case Tok::kText: return "text";
    case Tok::kBlockBegin: return "'{%'";
    case Tok::kBlockEnd: return "'%}'";
    case Tok::kVarBegin: return "'{{'";
    case Tok::kVarEnd: return "'}}'";
    case Tok::kName: return "name";
    case Tok::kString: return "string";
    case Tok::kInt: return "integer";
    case Tok::kFloat: return "float";
    case Tok::kOp: return "operator";
    case Tok::kEnd: return "end of template";
  }
  return "?";
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(const Program& prog, const std::string& name, bool trim, bool lstrip)
      : src_(prog.source), prog_(prog), name_(name), trim_(trim), lstrip_(lstrip) {}

  std::vector<Token> run() {
    size_t pos = 0, n = src_.size();
    while (pos < n) {
      size_t tag = find_tag(pos);
      size_t text_end = tag;
      if (tag < n) {
        char kind = src_[tag + 1];
        bool minus = tag + 2 < n && src_[tag + 2] == '-';
        bool plus = tag + 2 < n && src_[tag + 2] == '+';
        if (minus) {
          while (text_end > pos && is_space(src_[text_end - 1])) --text_end;
        } else if (lstrip_ && !plus && (kind == '%' || kind == '#')) {
          size_t k = text_end;
          while (k > pos && (src_[k - 1] == ' ' || src_[k - 1] == '\t')) --k;
          if (k == 0 || src_[k - 1] == '\n') text_end = k;
        }
      }
      if (text_end > pos) out_.push_back({Tok::kText, src_.substr(pos, text_end - pos), pos});
      if (tag >= n) break;
      char kind = src_[tag + 1];
      size_t p = tag + 2;
      if (p < n && (src_[p] == '-' || src_[p] == '+')) ++p;
      if (kind == '#') {
        size_t close = src_.find("#}", p);
        if (close == std::string::npos) error(tag, "unterminated comment: missing '#}'");
        bool rstrip = close > p && src_[close - 1] == '-';
        pos = after_tag(close + 2, rstrip, true);
      } else if (kind == '%' && is_raw(p)) {
        pos = lex_raw(tag, p);
      } else {
        out_.push_back({kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", tag});
        pos = lex_inside(p, kind == '%');
      }
    }
    out_.push_back({Tok::kEnd, "", n});
    return std::move(out_);
  }

 private:
  [[noreturn]] void error(size_t pos, const std::string& msg) {
    auto [l, c] = prog_.line_col(pos);
    MT_FAIL("[{}] syntax error at line {}, column {}: {}", name_, l, c, msg);
  }

  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }

  // Position after a closing tag, applying "-" (strip all following whitespace) or trim_blocks.
  size_t after_tag(size_t p, bool rstrip, bool block) const {
    if (rstrip) {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (block && trim_) {
      if (p < src_.size() && src_[p] == '\n') ++p;
      else if (p + 1 < src_.size() && src_[p] == '\r' && src_[p + 1] == '\n') p += 2;
    }
    return p;
  }

  bool is_raw(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t tag, size_t p) {
    size_t close = src_.find("%}", p);
    bool rstrip = src_[close - 1] == '-';
    size_t body = after_tag(close + 2, rstrip, true);
    for (size_t k = body; (k = src_.find("{%", k)) != std::string::npos; k += 2) {
      size_t q = k + 2;
      bool minus = q < src_.size() && src_[q] == '-';
      if (minus || (q < src_.size() && src_[q] == '+')) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      bool end_minus = src_.compare(q, 3, "-%}") == 0;
      if (!end_minus && src_.compare(q, 2, "%}") != 0) continue;
      size_t text_end = k;
      if (minus)
        while (text_end > body && is_space(src_[text_end - 1])) --text_end;
      if (text_end > body) out_.push_back({Tok::kText, src_.substr(body, text_end - body), body});
      return after_tag(q + (end_minus ? 3 : 2), end_minus, true);
    }
    error(tag, "missing {% endraw %} for this {% raw %}");
  }

  // Lexes the inside of {% %} or {{ }} starting at p; returns the position after the close tag.
  size_t lex_inside(size_t p, bool block) {
    size_t n = src_.size();
    int depth = 0;  // open brackets: "}}" inside a dict literal does not close the tag
    while (true) {
      while (p < n && is_space(src_[p])) ++p;
      if (p >= n) error(p, std::string("unexpected end of template, expected ") + (block ? "'%}'" : "'}}'"));
      const char* close = block ? "%}" : "}}";
      bool minus = src_[p] == '-' && src_.compare(p + 1, 2, close) == 0;
      if ((minus || src_.compare(p, 2, close) == 0) && (block || depth == 0)) {
        out_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", p});
        return after_tag(p + (minus ? 3 : 2), minus, block);
      }
      char c = src_[p];
      if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else if (is_digit(c)) {
        size_t s = p;
        while (p < n && (is_digit(src_[p]) || src_[p] == '_')) ++p;
        bool is_float = false;
        bool after_dot = !out_.empty() && out_.back().type == Tok::kOp && out_.back().text == ".";
        if (!after_dot && p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) {
          is_float = true;
          ++p;
          while (p < n && is_digit(src_[p])) ++p;
        }
        if (!after_dot && p < n && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < n && is_digit(src_[q])) {
            is_float = true;
            p = q;
            while (p < n && is_digit(src_[p])) ++p;
          }
        }
        std::string num;
        for (size_t k = s; k < p; ++k)
          if (src_[k] != '_') num += src_[k];
        out_.push_back({is_float ? Tok::kFloat : Tok::kInt, num, s});
      } else if (is_name_start(c)) {
        size_t s = p;
        while (p < n && (is_name_start(src_[p]) || is_digit(src_[p]))) ++p;
        out_.push_back({Tok::kName, src_.substr(s, p - s), s});
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                     "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        const char* found = nullptr;
        for (const char* op : kOps)
          if (src_.compare(p, std::strlen(op), op) == 0) { found = op; break; }
        if (!found) error(p, std::string("unexpected character '") + c + "'");
        if (*found == '(' || *found == '[' || *found == '{') ++depth;
        if ((*found == ')' || *found == ']' || *found == '}') && depth > 0) --depth;
        out_.push_back({Tok::kOp, found, p});
        p += std::strlen(found);
      }
    }
  }

  size_t lex_string(size_t p) {
    char q = src_[p];
    size_t s = p++;
    std::string val;
    while (true) {
      if (p >= src_.size()) error(s, "unterminated string literal");
      char c = src_[p];
      if (c == q) { ++p; break; }
      if (c != '\\') { val += c; ++p; continue; }
      if (p + 1 >= src_.size()) error(s, "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': val += '\n'; break;
        case 't': val += '\t'; break;
        case 'r': val += '\r'; break;
        case 'b': val += '\b'; break;
        case 'f': val += '\f'; break;
        case 'v': val += '\v'; break;
        case '0': val += '\0'; break;
        case '\\': val += '\\'; break;
        case '\'': val += '\''; break;
        case '"': val += '"'; break;
        case '\n': break;  // line continuation
        case 'x': case 'u': case 'U': {
          size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + len > src_.size()) error(p - 2, "truncated \\" + std::string(1, e) + " escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < len; ++k) {
            char h = src_[p + k];
            int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) error(p - 2, "invalid \\" + std::string(1, e) + " escape");
            cp = cp * 16 + uint32_t(d);
          }
          p += len;
          if (cp < 0x80) val += char(cp);
          else if (cp < 0x800) { val += char(0xC0 | (cp >> 6)); val += char(0x80 | (cp & 0x3F)); }
          else if (cp < 0x10000) {
            val += char(0xE0 | (cp >> 12)); val += char(0x80 | ((cp >> 6) & 0x3F)); val += char(0x80 | (cp & 0x3F));
          } else {
            val += char(0xF0 | (cp >> 18)); val += char(0x80 | ((cp >> 12) & 0x3F));
            val += char(0x80 | ((cp >> 6) & 0x3F)); val += char(0x80 | (cp & 0x3F));
          }
          break;
        }
        default: val += '\\'; val += e;  // Python keeps unknown escapes verbatim
      }
    }
    out_.push_back({Tok::kString, std::move(val), s});
    return p;
  }

  const std::string& src_;
  const Program& prog_;
  const std::string& name_;
  bool trim_, lstrip_;
  std::vector<Token> out_;
};

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
  Lexer lexer(*prog, name, trim_blocks, lstrip_blocks);
  Parser parser(lexer.run(), *prog, name);
  prog->body = parser.parse_template();
  return prog;
}

}  // namespace moetrain::jinja
