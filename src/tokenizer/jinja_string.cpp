// Python str semantics for the chat-template Jinja engine: UTF-8 strings treated as code
// point sequences (utf8proc for case mapping and categories), str methods (strip with chars,
// split with maxsplit, replace with count, startswith with tuples, title, find, join, is*) and
// the helpers the filters share.
#include <algorithm>

#include <utf8proc.h>

#include "tokenizer/jinja_builtins.h"

namespace moetrain::jinja {

const std::string& need_string(const Value* v, const char* what) {
  if (!v || !v->is_string()) fail(std::string(what) + " must be a string, got " + (v ? type_of(*v) : "nothing"));
  return v->s;
}

int64_t need_int(const Value* v, const char* what) {
  if (!v || (v->kind != Kind::kInt && v->kind != Kind::kBool))
    fail(std::string(what) + " must be an integer, got " + (v ? type_of(*v) : "nothing"));
  return v->kind == Kind::kBool ? v->b : v->i;
}

bool arg_bool(const CallArgs& a, size_t i, const char* name, bool def) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : def;
}

std::vector<char32_t> to_cps(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t n = utf8proc_ssize_t(s.size()), k = 0;
  while (k < n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t len = utf8proc_iterate(p + k, n - k, &cp);
    if (len <= 0) { cp = p[k]; len = 1; }  // invalid byte: keep it as a code point
    out.push_back(char32_t(cp));
    k += len;
  }
  return out;
}

std::string from_cps(const std::vector<char32_t>& cps, size_t b, size_t e) {
  std::string out;
  e = std::min(e, cps.size());
  for (size_t k = b; k < e; ++k) {
    utf8proc_uint8_t buf[4];
    auto len = utf8proc_encode_char(utf8proc_int32_t(cps[k]), buf);
    out.append(reinterpret_cast<char*>(buf), size_t(len));
  }
  return out;
}

bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
static bool is_letter(char32_t c) {
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
char32_t up(char32_t c) { return char32_t(utf8proc_toupper(utf8proc_int32_t(c))); }
char32_t low(char32_t c) { return char32_t(utf8proc_tolower(utf8proc_int32_t(c))); }

std::string map_case(const std::string& s, char32_t (*f)(char32_t)) {
  auto cps = to_cps(s);
  for (auto& c : cps) c = f(c);
  return from_cps(cps);
}

// Python str.strip/lstrip/rstrip: `chars` null -> whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cps = to_cps(s);
  std::vector<char32_t> set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) set = to_cps(need_string(chars, "strip() argument"));
  auto strip_it = [&](char32_t c) { return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_cps(cps, b, e);
}

Value py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  ValueList out;
  if (!sep || sep->is_none()) {
    auto cps = to_cps(s);
    size_t k = 0, n = cps.size();
    while (true) {
      while (k < n && py_space(cps[k])) ++k;
      if (k >= n) break;
      if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
        size_t e = n;
        while (e > k && py_space(cps[e - 1])) --e;
        out.push_back(Value::string(from_cps(cps, k, e)));
        break;
      }
      size_t b = k;
      while (k < n && !py_space(cps[k])) ++k;
      out.push_back(Value::string(from_cps(cps, b, k)));
    }
    return Value::new_list(std::move(out));
  }
  const std::string& d = need_string(sep, "split() separator");
  if (d.empty()) fail("empty separator");
  size_t b = 0;
  while (true) {
    size_t f = s.find(d, b);
    if (f == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) >= maxsplit)) {
      out.push_back(Value::string(s.substr(b)));
      break;
    }
    out.push_back(Value::string(s.substr(b, f - b)));
    b = f + d.size();
  }
  return Value::new_list(std::move(out));
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every code point and at both ends
    auto chars = utf8_chars(s);
    int64_t done = 0;
    for (auto& c : chars) {
      if (count < 0 || done < count) { out += to; ++done; }
      out += c;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t b = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(from, b);
    if (f == std::string::npos) break;
    out.append(s, b, f - b);
    out += to;
    b = f + from.size();
    ++done;
  }
  out.append(s, b, std::string::npos);
  return out;
}

// Python str.title(): a cased letter after an uncased character starts a word.
static std::string py_title(const std::string& s) {
  auto cps = to_cps(s);
  bool prev_cased = false;
  for (auto& c : cps) {
    bool letter = is_letter(c);
    c = letter ? (prev_cased ? low(c) : up(c)) : c;
    prev_cased = letter;
  }
  return from_cps(cps);
}

// Jinja's title filter: words split at whitespace and -({[< ; first char upper, rest lower.
std::string jinja_title(const std::string& s) {
  auto cps = to_cps(s);
  bool start = true;
  for (auto& c : cps) {
    bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) { start = true; continue; }
    c = start ? up(c) : low(c);
    start = false;
  }
  return from_cps(cps);
}

std::string capitalize(const std::string& s) {
  auto cps = to_cps(s);
  for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? up(cps[k]) : low(cps[k]);
  return from_cps(cps);
}

static bool prefix_test(const std::string& s, const Value* arg, bool ends, const char* fn) {
  if (!arg) fail(std::string(fn) + "() takes at least 1 argument (0 given)");
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return ends ? s.compare(s.size() - p.size(), p.size(), p) == 0 : s.compare(0, p.size(), p) == 0;
  };
  if (arg->is_string()) return one(arg->s);
  if (arg->is_list()) {
    for (auto& p : *arg->list)
      if (one(need_string(&p, fn))) return true;
    return false;
  }
  fail(std::string(fn) + "() argument must be str or a tuple of str, not " + type_of(*arg));
}

static Value bound(Function f) { return Value::function(std::move(f)); }

Value string_method(const std::string& s, const std::string& name) {
  if (name == "upper") return bound([s](const CallArgs&) { return Value::string(map_case(s, up)); });
  if (name == "lower") return bound([s](const CallArgs&) { return Value::string(map_case(s, low)); });
  if (name == "title") return bound([s](const CallArgs&) { return Value::string(py_title(s)); });
  if (name == "capitalize") return bound([s](const CallArgs&) { return Value::string(capitalize(s)); });
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return bound([s, l, r](const CallArgs& a) { return Value::string(py_strip(s, a.get(0, "chars"), l, r)); });
  }
  if (name == "split")
    return bound([s](const CallArgs& a) {
      const Value* m = a.get(1, "maxsplit");
      return py_split(s, a.get(0, "sep"), m ? need_int(m, "maxsplit") : -1);
    });
  if (name == "splitlines")
    return bound([s](const CallArgs&) {
      ValueList out;
      size_t b = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] != '\n' && s[k] != '\r') continue;
        out.push_back(Value::string(s.substr(b, k - b)));
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        b = k + 1;
      }
      if (b < s.size()) out.push_back(Value::string(s.substr(b)));
      return Value::new_list(std::move(out));
    });
  if (name == "startswith" || name == "endswith") {
    bool ends = name == "endswith";
    return bound([s, ends](const CallArgs& a) {
      return Value::boolean(prefix_test(s, a.get(0, "prefix"), ends, ends ? "endswith" : "startswith"));
    });
  }
  if (name == "replace")
    return bound([s](const CallArgs& a) {
      const Value* c = a.get(2, "count");
      return Value::string(py_replace(s, need_string(a.get(0, "old"), "replace() old"),
                                      need_string(a.get(1, "new"), "replace() new"), c ? need_int(c, "count") : -1));
    });
  if (name == "find" || name == "rfind" || name == "count") {
    return bound([s, name](const CallArgs& a) {
      const std::string& sub = need_string(a.get(0, "sub"), (name + "() argument").c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
        int64_t n = 0;
        for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
        return Value::integer(n);
      }
      size_t f = name == "find" ? s.find(sub) : s.rfind(sub);
      return Value::integer(f == std::string::npos ? -1 : int64_t(utf8_length(std::string_view(s).substr(0, f))));
    });
  }
  if (name == "join")
    return bound([s](const CallArgs& a) {
      const Value* it = a.get(0, "iterable");
      if (!it) fail("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (auto& x : iterate(*it)) {
        if (!first) out += s;
        first = false;
        out += need_string(&x, "join() item");
      }
      return Value::string(out);
    });
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" ||
      name == "isupper")
    return bound([s, name](const CallArgs&) {
      auto cps = to_cps(s);
      if (cps.empty()) return Value::boolean(false);
      bool cased = false;
      for (char32_t c : cps) {
        auto cat = utf8proc_category(utf8proc_int32_t(c));
        bool digit = cat == UTF8PROC_CATEGORY_ND;
        if (name == "isdigit" && !digit) return Value::boolean(false);
        if (name == "isalpha" && !is_letter(c)) return Value::boolean(false);
        if (name == "isalnum" && !is_letter(c) && !digit) return Value::boolean(false);
        if (name == "isspace" && !py_space(c)) return Value::boolean(false);
        if (name == "islower" || name == "isupper") {
          if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) {
            if (name == "islower") return Value::boolean(false);
            cased = true;
          } else if (cat == UTF8PROC_CATEGORY_LL) {
            if (name == "isupper") return Value::boolean(false);
            cased = true;
          }
        }
      }
      return Value::boolean(name == "islower" || name == "isupper" ? cased : true);
    });
  return Value();
}

}  // namespace moetrain::jinja
