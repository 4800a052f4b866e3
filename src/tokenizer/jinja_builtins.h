// Built-ins of the chat-template Jinja engine: filters, tests, attribute/item access with Python
// str/dict methods, and the global functions (range, namespace, raise_exception, strftime_now,
// dict). All raise EvalError on misuse; the interpreter adds the template location.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace moetrain::jinja {

Value apply_filter(const std::string& name, const Value& operand, const CallArgs& args);
bool apply_test(const std::string& name, const Value& operand, const CallArgs& args);
Value get_attr(const Value& obj, const std::string& name);  // obj.name (methods, then items)
Value get_item(const Value& obj, const Value& key);         // obj[key] (items, then methods)
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);
bool contains(const Value& container, const Value& item);   // Python `item in container`
ValueList iterate(const Value& v);                          // for-loop items (dict -> keys)
void add_globals(ValueDict& globals);

// Shared helpers (jinja_string.cpp).
inline std::string type_of(const Value& v) { return kind_name(v.kind); }
const std::string& need_string(const Value* v, const char* what);  // EvalError unless a str
int64_t need_int(const Value* v, const char* what);                 // EvalError unless an int/bool
bool arg_bool(const CallArgs& a, size_t i, const char* name, bool def);
std::vector<char32_t> to_cps(std::string_view s);
std::string from_cps(const std::vector<char32_t>& cps, size_t b = 0, size_t e = std::string::npos);
bool py_space(char32_t c);  // Python str.isspace() for one code point
char32_t up(char32_t c);
char32_t low(char32_t c);
std::string map_case(const std::string& s, char32_t (*f)(char32_t));
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
Value py_split(const std::string& s, const Value* sep, int64_t maxsplit);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
std::string jinja_title(const std::string& s);  // the title filter (Python str.title() is a method)
std::string capitalize(const std::string& s);
Value string_method(const std::string& s, const std::string& name);  // bound str method or Undefined

}  // namespace moetrain::jinja
