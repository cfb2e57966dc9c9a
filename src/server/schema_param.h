// A JSON schema from a request compiled to a grammar, its errors as 400s naming the field.
#pragma once
#include <string>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "server/json_fields.h"

namespace petrel::server {

// `param` names where the schema is ("response_format.json_schema.schema"); an unsupported
// keyword is a 400 naming the path below it ("...schema.properties.age") and the keyword.
grammar::Grammar compile_schema(const json& schema, const std::string& param);

// The 400 for `e`, a schema error below `param`.
[[noreturn]] void throw_schema_error(const grammar::SchemaError& e, const std::string& param);

}  // namespace petrel::server
