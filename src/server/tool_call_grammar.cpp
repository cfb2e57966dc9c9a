#include "server/tool_call_grammar.h"

#include <set>

#include "grammar/json_schema.h"
#include "grammar/rule_builder.h"
#include "server/api_error.h"
#include "server/schema_param.h"

namespace petrel::server {
namespace {

using namespace grammar;

// {"name": NAME, "arguments": ARGUMENTS}, the arguments held to the parameters.
Expr json_call(Grammar& g, const std::string& name, const json& parameters, const std::string& param) {
  const int32_t arguments = include(g, compile_schema(parameters, param));
  return seq({literal("{\"name\": " + json(name).dump() + ", \"arguments\": "), call(arguments), literal("}")});
}

// <function=NAME>\n, each parameter as <parameter=P>\nVALUE\n</parameter>\n in the schema's
// order (required ones always), then </function>. String parameters are raw text, the others
// JSON, as tool_calls.cpp reads them back.
Grammar xml_call(const std::string& name, const json& parameters, const std::string& param) {
  for (const auto& [key, value] : parameters.items())
    if (key != "type" && key != "properties" && key != "required" && key != "additionalProperties" &&
        key != "description" && key != "title" && key != "$defs" && key != "definitions" && key != "$schema")
      throw invalid(param, param + ": the keyword '" + key + "' is not supported for a forced call in this model's "
                                   "tool-call form (parameters are listed by \"properties\")");
  const json properties = parameters.value("properties", json::object());
  const json required_list = parameters.value("required", json::array());
  if (!properties.is_object()) throw invalid(param + ".properties", param + ".properties: expected an object");
  if (!required_list.is_array()) throw invalid(param + ".required", param + ".required: expected an array of names");
  std::set<std::string> required;
  for (const json& r : required_list) {
    if (!r.is_string()) throw invalid(param + ".required", param + ".required: expected names, found " + r.dump());
    required.insert(r.get<std::string>());
  }
  for (const std::string& r : required)
    if (!properties.contains(r)) throw invalid(param + ".required", param + ".required: '" + r + "' is not in properties");
  SchemaCompiler c(parameters);
  std::vector<Expr> parts{literal("<function=" + name + ">\n")};
  for (const auto& [key, schema] : properties.items()) {
    const std::string path = "properties." + key;
    const bool raw = schema.is_object() && schema.value("type", json()) == "string";
    const int32_t value = raw ? c.raw_string(schema, path) : c.rule(schema, path);
    const Expr p = seq({literal("<parameter=" + key + ">\n"), call(value), literal("\n</parameter>\n")});
    parts.push_back(required.count(key) ? p : optional(p));
  }
  parts.push_back(literal("</function>"));
  return c.finish(c.add(build_rule(name, seq(std::move(parts)))));
}

}  // namespace

ToolCallForm tool_call_form(const ChatTemplate& chat_template) {
  ChatRequest r;
  const json call = {{"type", "function"}, {"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}};
  r.messages = json::array({{{"role", "user"}, {"content", "x"}},
                            {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}}});
  r.tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}});
  try {
    return chat_template.apply(r).find("<function=") != std::string::npos ? ToolCallForm::Xml : ToolCallForm::Json;
  } catch (const std::exception&) {
    return ToolCallForm::Json;
  }
}

Grammar tool_call_grammar(const json& tools, const std::optional<std::string>& only, ToolCallForm form) {
  Grammar g;
  std::vector<Expr> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (only && name != *only) continue;
    const json parameters = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : json{{"type", "object"}};
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    if (form == ToolCallForm::Json) {
      calls.push_back(json_call(g, name, parameters, param));
      continue;
    }
    try {
      calls.push_back(call(include(g, xml_call(name, parameters, param))));
    } catch (const SchemaError& e) {
      throw_schema_error(e, param);
    }
  }
  g.rules.push_back(build_rule("tool call", seq({literal("<tool_call>\n"), alt(std::move(calls)), literal("\n</tool_call>")})));
  g.root = int32_t(g.rules.size()) - 1;
  return g;
}

}  // namespace petrel::server
