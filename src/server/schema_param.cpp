#include "server/schema_param.h"

#include "grammar/json_schema.h"
#include "server/api_error.h"

namespace petrel::server {

grammar::Grammar compile_schema(const json& schema, const std::string& param) {
  try {
    return grammar::json_schema_grammar(schema);
  } catch (const grammar::SchemaError& e) {
    const std::string where = e.path().empty() ? param : param + "." + e.path();
    throw invalid(where, where + ": " + e.message());
  }
}

}  // namespace petrel::server
