#include "server/schema_param.h"

#include "server/api_error.h"

namespace petrel::server {

void throw_schema_error(const grammar::SchemaError& e, const std::string& param) {
  const std::string where = e.path().empty() ? param : param + "." + e.path();
  throw invalid(where, where + ": " + e.message());
}

grammar::Grammar compile_schema(const json& schema, const std::string& param) {
  try {
    return grammar::json_schema_grammar(schema);
  } catch (const grammar::SchemaError& e) {
    throw_schema_error(e, param);
  }
}

}  // namespace petrel::server
