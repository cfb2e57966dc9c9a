// JSON Schema -> Grammar. Supported: type (object, array, string, number, integer, boolean,
// null, and lists of them), properties, required, additionalProperties (false, true or a
// schema; absent means false where "properties" is given, else true), items, prefixItems, minItems, maxItems, enum, const, anyOf,
// oneOf (as anyOf), local $ref with $defs / definitions, minLength, maxLength, pattern
// (pattern.h), format (date, time, date-time, email, uuid), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum. Annotations (title, description, default, examples, ...)
// are ignored; any other keyword is an error naming it. Properties come in the schema's order,
// the text on one line (json_text.h's space()).
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/expr.h"
#include "grammar/grammar.h"

namespace petrel::grammar {

using Json = nlohmann::ordered_json;

// Most items, characters (minItems, maxItems, minLength, maxLength) a bound may name.
constexpr int64_t kMaxCount = 1000;

// A schema the compiler cannot use. `path` says where ("properties.age", "" for the root); the
// message names the keyword.
class SchemaError : public Error {
 public:
  SchemaError(std::string path, std::string message);
  const std::string& path() const { return path_; }
  const std::string& message() const { return message_; }  // without the path

 private:
  std::string path_, message_;
};

// Rules for the schemas of one document, to join in a grammar of one's own (a tool call's).
class SchemaCompiler {
 public:
  // `document`: what "$ref"s point into.
  explicit SchemaCompiler(Json document);
  ~SchemaCompiler();

  // The rule of the JSON text of values valid under `schema` (found at `path`); throws
  // SchemaError.
  int32_t rule(const Json& schema, const std::string& path);
  // The rule of a "type": "string" schema's characters written raw (json_text.h's Spelling).
  int32_t raw_string(const Json& schema, const std::string& path);
  // Adds a rule built elsewhere, which may call the rules above.
  int32_t add(Rule rule);
  // Every rule, `root` the root.
  Grammar finish(int32_t root);

  class Impl;

 private:
  std::unique_ptr<Json> document_;  // where impl_ resolves references: it must not move
  std::unique_ptr<Impl> impl_;
};

// Values valid under `schema`, as JSON text.
Grammar json_schema_grammar(const Json& schema);
// Any JSON object (the "json_object" response format).
Grammar json_object_grammar();

}  // namespace petrel::grammar
