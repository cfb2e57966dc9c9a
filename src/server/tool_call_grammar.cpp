#include "server/tool_call_grammar.h"

#include "grammar/json_schema.h"
#include "grammar/rule_builder.h"
#include "server/api_error.h"
#include "server/schema_param.h"

namespace petrel::server {

grammar::Grammar tool_call_grammar(const json& tools, const std::optional<std::string>& only, ToolCallForm form) {
  using namespace grammar;
  if (form == ToolCallForm::Xml)
    throw invalid("tool_choice", "tool_choice: forcing a call is supported for the JSON tool-call form only; this "
                                 "model's chat template writes calls as <function=...> blocks");
  Grammar g;
  std::vector<Expr> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (only && name != *only) continue;
    const json parameters = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : json{{"type", "object"}};
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    const int32_t arguments = include(g, compile_schema(parameters, param));
    calls.push_back(seq({literal("{\"name\": " + json(name).dump() + ", \"arguments\": "), call(arguments), literal("}")}));
  }
  g.rules.push_back(build_rule("tool call", seq({literal("<tool_call>\n"), alt(std::move(calls)), literal("\n</tool_call>")})));
  g.root = int32_t(g.rules.size()) - 1;
  return g;
}

}  // namespace petrel::server
