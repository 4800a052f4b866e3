// Filters, tests, dict methods, attribute/item access and global functions of the chat-template Jinja
// engine, following Python Jinja2 3.x and transformers' additions (tojson with ensure_ascii,
// indent, separators, sort_keys; raise_exception; strftime_now). String methods live in
// jinja_string.cpp.
#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>


namespace moetrain::jinja {

namespace {

Value bound(Function f) { return Value::function(std::move(f)); }

Value items_of(const Value& d) {
  ValueList out;
  for (auto& [k, v] : d.dict->items) {
    Value t = Value::new_list({Value::string(k), v});
    t.is_tuple = true;
    out.push_back(std::move(t));
  }
  return Value::new_list(std::move(out));
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "items") return bound([d](const CallArgs&) { return items_of(d); });
  if (name == "keys")
    return bound([d](const CallArgs&) {
      ValueList out;
      for (auto& kv : d.dict->items) out.push_back(Value::string(kv.first));
      return Value::new_list(std::move(out));
    });
  if (name == "values")
    return bound([d](const CallArgs&) {
      ValueList out;
      for (auto& kv : d.dict->items) out.push_back(kv.second);
      return Value::new_list(std::move(out));
    });
  if (name == "get")
    return bound([d](const CallArgs& a) {
      const Value* k = a.get(0, "key");
      if (!k) fail("get() takes at least 1 argument");
      const Value* v = k->is_string() ? d.dict->find(k->s) : nullptr;
      if (v) return *v;
      const Value* def = a.get(1, "default");
      return def ? *def : Value::none();
    });
  return Value();
}

// Attribute path "a.b.0" as Jinja's attribute= arguments use it.
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  while (true) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = numeric && cur.is_list() ? get_item(cur, Value::integer(std::stoll(part))) : get_item(cur, Value::string(part));
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

CallArgs tail_args(const CallArgs& a, size_t from) {
  CallArgs r;
  for (size_t k = from; k < a.args.size(); ++k) r.args.push_back(a.args[k]);
  r.kwargs = a.kwargs;
  return r;
}

int sort_compare(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string())
    return compare(Value::string(map_case(a.s, low)), Value::string(map_case(b.s, low)));
  return compare(a, b);
}

}  // namespace

ValueList iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList: return *v.list;
    case Kind::kDict: {
      ValueList out;
      for (auto& kv : v.dict->items) out.push_back(Value::string(kv.first));
      return out;
    }
    case Kind::kString: {
      ValueList out;
      for (auto& c : utf8_chars(v.s)) out.push_back(Value::string(c));
      return out;
    }
    default: fail("'" + type_of(v) + "' object is not iterable");
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::kDict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      const Value* v = obj.dict->find(name);
      return v ? *v : Value();
    }
    case Kind::kNamespace: {
      const Value* v = obj.dict->find(name);
      return v ? *v : Value();
    }
    case Kind::kString: return string_method(obj.s, name);
    default: return Value();
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::kDict: {
      if (key.is_string()) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        return dict_method(obj, key.s);
      }
      return Value();
    }
    case Kind::kNamespace: return key.is_string() ? get_attr(obj, key.s) : Value();
    case Kind::kList:
    case Kind::kString: {
      if (key.is_string()) return obj.is_string() ? string_method(obj.s, key.s) : Value();
      if (key.kind != Kind::kInt && key.kind != Kind::kBool) return Value();
      int64_t i = key.kind == Kind::kBool ? key.b : key.i;
      if (obj.is_list()) {
        int64_t n = int64_t(obj.list->size());
        if (i < 0) i += n;
        return i >= 0 && i < n ? (*obj.list)[size_t(i)] : Value();
      }
      auto chars = utf8_chars(obj.s);
      int64_t n = int64_t(chars.size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? Value::string(chars[size_t(i)]) : Value();
    }
    default: return Value();
  }
}

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto opt_int = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return need_int(&v, what);
  };
  std::vector<Value> items;
  std::vector<std::string> chars;
  if (obj.is_list()) items = *obj.list;
  else if (obj.is_string()) chars = utf8_chars(obj.s);
  else fail("'" + type_of(obj) + "' object is not subscriptable");
  int64_t n = obj.is_list() ? int64_t(items.size()) : int64_t(chars.size());
  int64_t st = opt_int(step, "slice step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto a = opt_int(start, "slice start"), b = opt_int(stop, "slice stop");
  // Python's PySlice_AdjustIndices.
  int64_t lo, hi;
  auto adjust = [&](std::optional<int64_t> x, int64_t def) {
    if (!x) return def;
    int64_t v = *x;
    if (v < 0) { v += n; if (v < 0) v = st < 0 ? -1 : 0; }
    else if (v >= n) v = st < 0 ? n - 1 : n;
    return v;
  };
  lo = adjust(a, st < 0 ? n - 1 : 0);
  hi = adjust(b, st < 0 ? -1 : n);
  ValueList out_list;
  std::string out_str;
  for (int64_t k = lo; st > 0 ? k < hi : k > hi; k += st) {
    if (obj.is_list()) out_list.push_back(items[size_t(k)]);
    else out_str += chars[size_t(k)];
  }
  return obj.is_list() ? Value::new_list(std::move(out_list)) : Value::string(std::move(out_str));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_of(item));
      return container.s.find(item.s) != std::string::npos;
    case Kind::kList:
      for (auto& x : *container.list)
        if (equals(x, item)) return true;
      return false;
    case Kind::kDict: return item.is_string() && container.dict->find(item.s) != nullptr;
    default: fail("argument of type '" + type_of(container) + "' is not iterable");
  }
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
  const Value* x = a.get(0, "value");
  auto need_arg = [&]() -> const Value& {
    if (!x) fail("test '" + name + "' needs an argument");
    return *x;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.kind == Kind::kInt || v.kind == Kind::kFloat;
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true") return v.kind == Kind::kBool && v.b;
  if (name == "false") return v.kind == Kind::kBool && !v.b;
  if (name == "mapping") return v.is_dict();
  if (name == "iterable" || name == "sequence")
    return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.kind == Kind::kFunction;
  if (name == "sameas") {
    const Value& o = need_arg();
    if (v.kind != o.kind) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict() || v.kind == Kind::kNamespace) return v.dict == o.dict;
    return equals(v, o);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, need_arg());
  if (name == "ne" || name == "!=") return !equals(v, need_arg());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, need_arg()) < 0;
  if (name == "le" || name == "<=") return compare(v, need_arg()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, need_arg()) > 0;
  if (name == "ge" || name == ">=") return compare(v, need_arg()) >= 0;
  if (name == "in") return contains(need_arg(), v);
  if (name == "odd" || name == "even") {
    int64_t i = need_int(&v, name.c_str());
    return (((i % 2) + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "divisibleby") {
    int64_t d = need_int(&need_arg(), "divisibleby argument");
    if (d == 0) fail("integer division or modulo by zero");
    return need_int(&v, "divisibleby operand") % d == 0;
  }
  if (name == "lower") return v.is_string() && map_case(v.s, low) == v.s;
  if (name == "upper") return v.is_string() && map_case(v.s, up) == v.s;
  fail("unknown test '" + name + "'");
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& a) {
  if (name == "safe") return v;
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Kind::kUndefined: return Value::integer(0);
      case Kind::kString: return Value::integer(int64_t(utf8_length(v.s)));
      case Kind::kList: return Value::integer(int64_t(v.list->size()));
      case Kind::kDict: return Value::integer(int64_t(v.dict->items.size()));
      default: fail("object of type '" + type_of(v) + "' has no len()");
    }
  }
  if (name == "tojson") {
    JsonOptions o;
    if (const Value* ind = a.get(0, "indent"); ind && !ind->is_none()) o.indent = int(need_int(ind, "tojson indent"));
    o.ensure_ascii = arg_bool(a, 99, "ensure_ascii", false);
    o.sort_keys = arg_bool(a, 99, "sort_keys", false);
    if (o.indent) o.item_sep = ",";
    if (const Value* sep = a.kwarg("separators"); sep && !sep->is_none()) {
      if (!sep->is_list() || sep->list->size() != 2) fail("tojson separators must be a pair of strings");
      o.item_sep = need_string(&(*sep->list)[0], "item separator");
      o.key_sep = need_string(&(*sep->list)[1], "key separator");
    }
    return Value::string(to_json(v, o));
  }
  if (name == "string") return Value::string(to_str(v));
  if (name == "default" || name == "d") {
    const Value* def = a.get(0, "default_value");
    bool boolean = arg_bool(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !truthy(v))) return def ? *def : Value::string("");
    return v;
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "trim") {
    if (!v.is_string()) {
      if (v.is_undefined()) return Value::string("");
      if (name != "trim" && name != "title" && name != "capitalize")
        return Value::string(map_case(to_str(v), name == "upper" ? up : low));
    }
    std::string s = to_str(v);
    if (name == "upper") return Value::string(map_case(s, up));
    if (name == "lower") return Value::string(map_case(s, low));
    if (name == "title") return Value::string(jinja_title(s));
    if (name == "capitalize") return Value::string(capitalize(s));
    return Value::string(py_strip(s, a.get(0, "chars"), true, true));
  }
  if (name == "first" || name == "last") {
    ValueList items = iterate(v);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::new_list(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::new_list();
    if (!v.is_dict()) fail("items filter expects a mapping, got " + type_of(v));
    return items_of(v);
  }
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string d = sep ? to_str(*sep) : "";
    std::string out;
    bool first = true;
    for (auto& x : iterate(v)) {
      if (!first) out += d;
      first = false;
      out += to_str(attr ? attr_path(x, to_str(*attr)) : x);
    }
    return Value::string(out);
  }
  if (name == "int") {
    const Value* def = a.get(0, "default");
    Value dv = def ? *def : Value::integer(0);
    if (v.kind == Kind::kInt) return v;
    if (v.kind == Kind::kBool) return Value::integer(v.b);
    if (v.kind == Kind::kFloat) return std::isfinite(v.f) ? Value::integer(int64_t(v.f)) : dv;
    if (v.is_string()) {
      std::string s = py_strip(v.s, nullptr, true, true);
      try {
        size_t used = 0;
        long long x = std::stoll(s, &used, 10);
        if (used == s.size()) return Value::integer(x);
        double f = std::stod(s, &used);
        if (used == s.size()) return Value::integer(int64_t(f));
      } catch (const std::exception&) {
      }
    }
    return dv;
  }
  if (name == "float") {
    const Value* def = a.get(0, "default");
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string()) {
      try {
        size_t used = 0;
        std::string s = py_strip(v.s, nullptr, true, true);
        double f = std::stod(s, &used);
        if (used == s.size()) return Value::number(f);
      } catch (const std::exception&) {
      }
    }
    return def ? *def : Value::number(0.0);
  }
  if (name == "abs") {
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::integer(std::llabs(v.kind == Kind::kBool ? v.b : v.i));
    if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
    fail("bad operand type for abs(): '" + type_of(v) + "'");
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cps = to_cps(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::string(from_cps(cps));
    }
    ValueList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (name == "replace") {
    const Value *c = a.get(2, "count"), *o = a.get(0, "old"), *nw = a.get(1, "new");
    if (!o || !nw) fail("replace filter takes (old, new[, count])");
    return Value::string(py_replace(to_str(v), to_str(*o), to_str(*nw), c ? need_int(c, "count") : -1));
  }
  if (name == "indent") {
    const Value* w = a.get(0, "width");
    std::string pad = w ? (w->is_string() ? w->s : std::string(size_t(need_int(w, "indent width")), ' ')) : "    ";
    bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
    std::string s = to_str(v), out;
    size_t b = 0;
    for (int line = 0;; ++line) {
      size_t e = s.find('\n', b);
      std::string l = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if ((line > 0 || first) && (blank || !l.empty())) out += pad;
      out += l;
      if (e == std::string::npos) break;
      out += '\n';
      b = e + 1;
    }
    return Value::string(out);
  }
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : to_str(v)) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Value::string(out);
  }
  if (name == "unique") {
    bool cs = arg_bool(a, 0, "case_sensitive", false);
    ValueList out;
    for (auto& x : iterate(v)) {
      bool seen = false;
      for (auto& y : out) seen = seen || sort_compare(x, y, cs) == 0;
      if (!seen) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "sort") {
    bool rev = arg_bool(a, 0, "reverse", false), cs = arg_bool(a, 1, "case_sensitive", false);
    const Value* attr = a.get(2, "attribute");
    ValueList items = iterate(v);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      Value kx = attr ? attr_path(x, to_str(*attr)) : x, ky = attr ? attr_path(y, to_str(*attr)) : y;
      int c = sort_compare(kx, ky, cs);
      return rev ? c > 0 : c < 0;
    });
    return Value::new_list(std::move(items));
  }
  if (name == "dictsort") {
    if (!v.is_dict()) fail("dictsort expects a mapping, got " + type_of(v));
    bool cs = arg_bool(a, 0, "case_sensitive", false), rev = arg_bool(a, 2, "reverse", false);
    const Value* by = a.get(1, "by");
    int idx = by && to_str(*by) == "value" ? 1 : 0;
    ValueList items = *items_of(v).list;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      int c = sort_compare((*x.list)[size_t(idx)], (*y.list)[size_t(idx)], cs);
      return rev ? c > 0 : c < 0;
    });
    return Value::new_list(std::move(items));
  }
  if (name == "min" || name == "max") {
    ValueList items = iterate(v);
    if (items.empty()) return Value();
    Value best = items[0];
    for (auto& x : items) {
      int c = sort_compare(x, best, false);
      if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = x;
    }
    return best;
  }
  if (name == "sum") {
    Value total = Value::integer(0);
    for (auto& x : iterate(v)) {
      if (!x.is_number()) fail("sum of a non-number: " + type_of(x));
      if (total.kind == Kind::kFloat || x.kind == Kind::kFloat) total = Value::number(total.as_double() + x.as_double());
      else total = Value::integer(total.i + (x.kind == Kind::kBool ? x.b : x.i));
    }
    return total;
  }
  if (name == "map") {
    ValueList out;
    if (const Value* attr = a.kwarg("attribute")) {
      const Value* def = a.kwarg("default");
      for (auto& x : iterate(v)) {
        Value r = attr_path(x, to_str(*attr));
        out.push_back(r.is_undefined() && def ? *def : r);
      }
    } else {
      const std::string& f = need_string(a.get(0, "filter"), "map filter name");
      CallArgs rest = tail_args(a, 1);
      for (auto& x : iterate(v)) out.push_back(apply_filter(f, x, rest));
    }
    return Value::new_list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool attr_mode = name == "selectattr" || name == "rejectattr";
    bool want = name == "select" || name == "selectattr";
    size_t t = attr_mode ? 1 : 0;
    std::string attr = attr_mode ? need_string(a.get(0, "attribute"), "attribute name") : "";
    const Value* test = t < a.args.size() ? &a.args[t] : nullptr;
    CallArgs rest = tail_args(a, t + 1);
    rest.kwargs.clear();
    ValueList out;
    for (auto& x : iterate(v)) {
      Value subject = attr_mode ? attr_path(x, attr) : x;
      bool r = test ? apply_test(need_string(test, "test name"), subject, rest) : truthy(subject);
      if (r == want) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "round") {
    const Value* p = a.get(0, "precision");
    int64_t prec = p ? need_int(p, "precision") : 0;
    const Value* m = a.get(1, "method");
    std::string method = m ? to_str(*m) : "common";
    double scale = std::pow(10.0, double(prec)), x = v.as_double() * scale;
    double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value::number(r / scale);
  }
  if (name == "wordcount") return Value::integer(int64_t(py_split(to_str(v), nullptr, -1).list->size()));
  if (name == "attr") return get_attr(v, to_str(a.get(0, "name") ? *a.get(0, "name") : Value()));
  fail("unknown filter '" + name + "'");
}

void add_globals(ValueDict& g) {
  g.set("range", Value::function([](const CallArgs& a) {
          if (a.args.empty() || a.args.size() > 3) fail("range() takes 1 to 3 arguments");
          int64_t start = 0, stop, step = 1;
          if (a.args.size() == 1) stop = need_int(&a.args[0], "range() argument");
          else {
            start = need_int(&a.args[0], "range() start");
            stop = need_int(&a.args[1], "range() stop");
            if (a.args.size() == 3) step = need_int(&a.args[2], "range() step");
          }
          if (step == 0) fail("range() arg 3 must not be zero");
          ValueList out;
          for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
            out.push_back(Value::integer(k));
            if (out.size() > 10000000) fail("range() too large");
          }
          return Value::new_list(std::move(out));
        }));
  g.set("namespace", Value::function([](const CallArgs& a) {
          Value ns = Value::new_namespace();
          for (auto& x : a.args) {
            if (!x.is_dict()) fail("namespace() positional argument must be a mapping, got " + type_of(x));
            for (auto& [k, v] : x.dict->items) ns.dict->set(k, v);
          }
          for (auto& [k, v] : a.kwargs) ns.dict->set(k, v);
          return ns;
        }));
  g.set("dict", Value::function([](const CallArgs& a) {
          Value d = Value::new_dict();
          for (auto& x : a.args)
            if (x.is_dict())
              for (auto& [k, v] : x.dict->items) d.dict->set(k, v);
          for (auto& [k, v] : a.kwargs) d.dict->set(k, v);
          return d;
        }));
  g.set("raise_exception", Value::function([](const CallArgs& a) -> Value {
          fail("raise_exception: " + (a.args.empty() ? std::string() : to_str(a.args[0])));
        }));
  g.set("strftime_now", Value::function([](const CallArgs& a) {
          const std::string& fmt = need_string(a.get(0, "format"), "strftime_now() format");
          std::time_t t = std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
          return Value::string(std::string(buf, n));
        }));
}

}  // namespace moetrain::jinja
