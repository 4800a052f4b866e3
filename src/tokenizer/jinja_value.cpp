// Jinja values: JSON conversion, truthiness, Python equality/ordering, str()/repr() and the
// json.dumps serializer used by the tojson filter (floats as Python repr, shortest round trip).
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>


namespace moetrain::jinja {

const Value* ValueDict::find(std::string_view key) const {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* ValueDict::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value v) {
  if (Value* old = find(key)) *old = std::move(v);
  else items.emplace_back(key, std::move(v));
}

const Value* CallArgs::kwarg(std::string_view name) const {
  for (auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

const Value* CallArgs::get(size_t idx, std::string_view name) const {
  if (idx < args.size()) return &args[idx];
  return kwarg(name);
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kFunction: return "function";
  }
  return "?";
}

Value Value::new_list(ValueList items) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::new_dict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>();
  return v;
}

Value Value::new_namespace() {
  Value v;
  v.kind = Kind::kNamespace;
  v.dict = std::make_shared<ValueDict>();
  return v;
}

Value Value::function(Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

template <typename Json>
static Value from_json_impl(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u <= uint64_t(INT64_MAX)) return Value::integer(int64_t(u));
      return Value::number(double(u));
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (auto& e : j) items.push_back(from_json_impl(e));
      return Value::new_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::new_dict();
      d.dict->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict->items.emplace_back(it.key(), from_json_impl(it.value()));
      return d;
    }
    default: return Value();
  }
}

Value from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0.0;
    case Kind::kString: return !v.s.empty();
    case Kind::kList: return !v.list->empty();
    case Kind::kDict: return !v.dict->items.empty();
    case Kind::kNamespace:
    case Kind::kFunction: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      int64_t x = a.kind == Kind::kBool ? a.b : a.i, y = b.kind == Kind::kBool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.s == b.s;
    case Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    case Kind::kFunction: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      int64_t x = a.kind == Kind::kBool ? a.b : a.i, y = b.kind == Kind::kBool ? b.b : b.i;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) {
    int c = a.s.compare(b.s);  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Kind::kList && b.kind == Kind::kList) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(std::string("'<' not supported between instances of '") + kind_name(a.kind) + "' and '" +
       kind_name(b.kind) + "'");
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout: fixed notation for exponents in
  // [-4, 16), otherwise d.ddde+XX with at least two exponent digits.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp10 = std::stoi(sci.substr(epos + 1));
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    int n = int(digits.size());
    if (exp10 < 0) {
      out += "0." + std::string(size_t(-exp10 - 1), '0') + digits;
    } else if (exp10 + 1 >= n) {
      out += digits + std::string(size_t(exp10 + 1 - n), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exp10 + 1)) + "." + digits.substr(size_t(exp10 + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char e[16];
  std::snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + e;
}

static std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) { out += '\\'; out += q; }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += char(c);
    }
  }
  out += q;
  return out;
}

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Kind::kString: return repr_string(v.s);
    case Kind::kList: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += to_repr((*v.list)[k]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_repr(x);
      }
      return out + "}";
    }
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + to_repr(x);
      }
      return out + "}>";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return python_float_repr(v.f);
    case Kind::kString: return v.s;
    case Kind::kFunction: return "<function>";
    default: return to_repr(v);
  }
}

// Decodes one code point of (assumed mostly valid) UTF-8; an invalid byte decodes as itself.
static uint32_t decode_cp(std::string_view s, size_t& k) {
  unsigned char c = s[k];
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n <= 0 || k + size_t(n) >= s.size()) { ++k; return c; }
  uint32_t cp = c & (0x3F >> n);
  for (int t = 1; t <= n; ++t) {
    unsigned char cc = s[k + size_t(t)];
    if ((cc & 0xC0) != 0x80) { ++k; return c; }
    cp = (cp << 6) | (cc & 0x3F);
  }
  k += size_t(n) + 1;
  return cp;
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t k = 0; k < s.size();) {
    unsigned char c = s[k];
    if (c >= 0x80 && ensure_ascii) {
      uint32_t cp = decode_cp(s, k);
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", cp);
      }
      out += b;
      continue;
    }
    ++k;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (c == 0x7f && ensure_ascii)) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

static void json_value(std::string& out, const Value& v, const JsonOptions& opt, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(size_t(*opt.indent) * size_t(d), ' ');
  };
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.b ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.i); return;
    case Kind::kFloat:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += python_float_repr(v.f);
      return;
    case Kind::kString: json_string(out, v.s, opt.ensure_ascii); return;
    case Kind::kList: {
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.indent) newline(depth + 1);
        json_value(out, (*v.list)[k], opt, depth + 1);
      }
      if (opt.indent) newline(depth);
      out += ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (v.dict->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.indent) newline(depth + 1);
        json_string(out, items[k]->first, opt.ensure_ascii);
        out += opt.key_sep;
        json_value(out, items[k]->second, opt, depth + 1);
      }
      if (opt.indent) newline(depth);
      out += '}';
      return;
    }
    case Kind::kFunction: fail("Object of type function is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(out, v, opt, 0);
  return out;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    size_t start = k;
    decode_cp(s, k);
    out.emplace_back(s.substr(start, k - start));
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace moetrain::jinja
