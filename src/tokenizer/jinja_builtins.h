// Built-ins of the chat-template Jinja engine: filters, tests, attribute/item access with Python
// str/dict methods, and the global functions (range, namespace, raise_exception, strftime_now,
// dict). All raise EvalError on misuse; the interpreter adds the template location.
#pragma once
#include <string>

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

}  // namespace moetrain::jinja
