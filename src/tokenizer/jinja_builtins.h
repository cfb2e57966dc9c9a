// Jinja2's filters, tests, global functions and the Python methods of str/dict/list that chat
// templates call. Failures throw std::runtime_error; the evaluator adds the template line.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace petrel::jinja {

bool is_filter(const std::string& name);
bool is_test(const std::string& name);

Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
bool apply_test(const std::string& name, const Value& input, CallArgs& args);

// Whether `object.name` is a method (str.startswith, dict.items, ...) rather than data.
bool has_method(const Value& object, const std::string& name);
Value call_method(const Value& object, const std::string& name, CallArgs& args);

// The global functions Hugging Face provides: range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> global_functions();

// Thrown by raise_exception(); carries the template's own message.
struct TemplateRaised : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace petrel::jinja
