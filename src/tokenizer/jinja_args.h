// Reads the arguments of a filter, test, method or global call by position or keyword.
#pragma once
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace petrel::jinja {

class Args {
 public:
  // `params` are the parameter names in positional order; more arguments than that, or unknown
  // keywords, are an error naming `function`.
  Args(CallArgs& call, std::string function, std::initializer_list<const char*> params)
      : call_(call), function_(std::move(function)), params_(params) {
    if (call_.positional.size() > params_.size())
      throw std::runtime_error(function_ + "() takes at most " + std::to_string(params_.size()) + " argument(s), " +
                               std::to_string(call_.positional.size()) + " given");
    for (const auto& [key, _] : call_.keyword) {
      bool known = false;
      for (const char* p : params_) known |= key == p;
      if (!known) throw std::runtime_error(function_ + "() got an unexpected keyword argument '" + key + "'");
    }
  }

  // The argument for parameter `index`, or nullptr when not given.
  const Value* get(size_t index) const {
    if (index < call_.positional.size()) return &call_.positional[index];
    const char* name = params_[index];
    for (const auto& [key, v] : call_.keyword)
      if (key == name) return &v;
    return nullptr;
  }

  Value value_or(size_t index, Value fallback) const {
    const Value* v = get(index);
    return v ? *v : std::move(fallback);
  }

  bool flag(size_t index, bool fallback) const {
    const Value* v = get(index);
    return v ? truthy(*v) : fallback;
  }

  const Value& required(size_t index) const {
    const Value* v = get(index);
    if (!v) throw std::runtime_error(function_ + "() missing required argument '" + params_[index] + "'");
    return *v;
  }

  std::string string_or(size_t index, std::string fallback) const {
    const Value* v = get(index);
    if (!v || v->is_none()) return fallback;
    if (!v->is_string())
      throw std::runtime_error(function_ + "(): argument '" + params_[index] + "' must be str, not " +
                               type_name(*v));
    return v->s();
  }

  int64_t int_or(size_t index, int64_t fallback) const {
    const Value* v = get(index);
    if (!v || v->is_none()) return fallback;
    if (v->kind == Value::Kind::Bool) return v->boolean;
    if (v->kind != Value::Kind::Int)
      throw std::runtime_error(function_ + "(): argument '" + params_[index] + "' must be int, not " +
                               type_name(*v));
    return v->integer;
  }

 private:
  CallArgs& call_;
  std::string function_;
  std::vector<const char*> params_;  // copied: an initializer_list's array dies with the call
};

}  // namespace petrel::jinja
