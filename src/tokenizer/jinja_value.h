// Values of the chat-template language, with the Python semantics Jinja2 gives them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace petrel::jinja {

struct Value;
using List = std::vector<Value>;
// Insertion-ordered, like Python dicts (tojson and loops must keep the order of the input JSON).
using Dict = std::vector<std::pair<std::string, Value>>;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using NativeFunction = std::function<Value(CallArgs&)>;

struct Callable {
  std::string name;
  NativeFunction fn;
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

  Kind kind = Kind::Undefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::shared_ptr<const std::string> str;  // String; for Undefined, the error that using it raises
  std::shared_ptr<List> list;              // List (also tuples)
  bool is_tuple = false;
  std::shared_ptr<Dict> dict;              // Dict and Namespace
  std::shared_ptr<const Callable> callable;

  // `why` is the message an operation on the value fails with, e.g. "'x' is undefined".
  static Value undefined(std::string why = "value is undefined");
  static Value none();
  static Value from(bool b);
  static Value from(int64_t i);
  static Value from(int i) { return from(static_cast<int64_t>(i)); }
  static Value from(double d);
  static Value from(std::string s);
  static Value from(const char* s) { return from(std::string(s)); }
  static Value from(List items, bool tuple = false);
  static Value from(Dict items);
  static Value make_namespace(Dict items);
  static Value function(std::string name, NativeFunction fn);
  // Throws std::invalid_argument past 256 levels of nesting (values are walked recursively).
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  const std::string& s() const { return *str; }

  // The entry `key` of a Dict or Namespace, or nullptr.
  const Value* find(const std::string& key) const;
};

// Python's name for the type, for error messages ("str", "int", "NoneType", ...).
std::string type_name(const Value& v);

bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Python ordering (<): numbers with numbers, strings with strings, sequences elementwise.
// Throws std::invalid_argument for unorderable types.
bool less(const Value& a, const Value& b);

// str(v) as Jinja prints it; Undefined prints as the empty string.
std::string to_str(const Value& v);
// Python repr(v).
std::string repr(const Value& v);
// Python repr of a float ("1.0", "1e-05", "inf").
std::string float_repr(double d);

struct JsonOptions {
  std::optional<int> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator = ", ";  // Python's defaults; "," when indenting
  std::string key_separator = ": ";
};
// Python json.dumps(v, ...); throws std::invalid_argument for values JSON cannot hold.
std::string to_json(const Value& v, const JsonOptions& options);

// Elements a for loop visits: list items, dict keys, string characters; Undefined is empty.
// Throws std::invalid_argument for values that cannot be iterated.
List iterate(const Value& v);

}  // namespace petrel::jinja
