// Values of the Jinja interpreter behind chat templates: Python-like None/bool/int/float/str/
// list/dict plus Jinja's Undefined, namespace() objects and callables. Lists, dicts and
// namespaces are shared by reference as in Python; str(), repr() and tojson follow Python's
// formatting (json.dumps with ensure_ascii=False, as transformers' tojson does).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moetrain::jinja {

// Error raised while evaluating, before the location is known; the interpreter adds the line
// and column of the innermost node being evaluated and rethrows it as moetrain::Error.
struct EvalError : std::runtime_error {
  explicit EvalError(const std::string& m) : std::runtime_error(m) {}
};
[[noreturn]] inline void fail(const std::string& msg) { throw EvalError(msg); }

struct Value;
using ValueList = std::vector<Value>;

// Insertion-ordered string-keyed map (Python dicts keep insertion order; chat dicts are small).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  const Value* kwarg(std::string_view name) const;
  // Positional argument i, else keyword `name`, else nullptr.
  const Value* get(size_t i, std::string_view name) const;
};
using Function = std::function<Value(const CallArgs&)>;

enum class Kind : uint8_t {
  kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction
};
const char* kind_name(Kind k);  // Python type names: "int", "str", "list", "dict", ...

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;  // also holds a namespace's attributes
  std::shared_ptr<Function> fn;
  bool is_tuple = false;  // lists built from (a, b) literals; only affects repr()

  static Value none() { Value v; v.kind = Kind::kNone; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::kFloat; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::kString; v.s = std::move(x); return v; }
  static Value new_list(ValueList items = {});
  static Value new_dict();
  static Value new_namespace();
  static Value function(Function f);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  double as_double() const { return kind == Kind::kFloat ? f : kind == Kind::kBool ? (b ? 1 : 0) : double(i); }
};

// nlohmann::json sorts object keys; pass nlohmann::ordered_json to keep the input's key order
// (tojson output depends on it).
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);  // Python ==: 1 == 1.0 == True, deep for containers
// Python ordering for <, >, ...: numbers, strings (code point order), lists lexicographically;
// throws EvalError for unorderable types.
int compare(const Value& a, const Value& b);

std::string to_str(const Value& v);   // Python str(); Undefined renders as ""
std::string to_repr(const Value& v);  // Python repr()
std::string python_float_repr(double x);

struct JsonOptions {
  std::optional<int> indent;
  bool ensure_ascii = false;
  std::string item_sep = ", ";  // json.dumps default; ",", when indent is set
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opt);  // Python json.dumps

// Python str semantics over UTF-8: length and indices count code points.
std::vector<std::string> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

}  // namespace moetrain::jinja
