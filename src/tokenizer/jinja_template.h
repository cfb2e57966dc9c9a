// A parsed Jinja2 template (the subset chat templates use), rendered with Hugging Face's settings.
#pragma once
#include <string>
#include <string_view>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace petrel::jinja {

class Template {
 public:
  // Parses `source`; syntax errors and unsupported constructs throw petrel::Error with the line.
  explicit Template(std::string_view source);

  // Renders with `variables` (plus the globals range, namespace, dict, raise_exception,
  // strftime_now). Runtime errors throw petrel::Error naming the line.
  std::string render(const Dict& variables) const;

 private:
  Body body_;
};

}  // namespace petrel::jinja
