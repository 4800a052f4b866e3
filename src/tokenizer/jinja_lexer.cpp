// Lexer of the chat-template Jinja subset (see jinja_lexer.h): one pass over the source that
// keeps byte offsets, so parse errors can name the template line and column.
#include "tokenizer/jinja_lexer.h"

#include <cstring>

#include "core/check.h"

namespace moetrain::jinja {

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

namespace {

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

}  // namespace

std::vector<Token> lex_template(const Program& prog, const std::string& name, bool trim_blocks, bool lstrip_blocks) {
  Lexer lexer(prog, name, trim_blocks, lstrip_blocks);
  return lexer.run();
}

}  // namespace moetrain::jinja
