// /v1/chat/completions: the shared fields plus messages, tools and template arguments.
#include "server/api_error.h"
#include "server/chat_messages.h"
#include "server/request.h"

namespace petrel::server {
namespace {

struct ToolChoice {
  bool calls = true;                  // the answer may call tools ("none": no)
  bool forced = false;                // "required" or a named function: it must
  std::optional<std::string> only;    // the function a named choice names
};

bool has_function(const json& tools, const std::string& name) {
  for (const json& tool : tools)
    if (tool["function"]["name"] == name) return true;
  return false;
}

// "auto", "none", "required" or {"type": "function", "function": {"name": ...}}.
ToolChoice parse_tool_choice(const Fields& f, const json& tools) {
  const json* choice = f.get("tool_choice");
  if (!choice || *choice == "auto") return {};
  ToolChoice c;
  if (*choice == "none") {
    c.calls = false;
    return c;
  }
  const bool any_tools = tools.is_array() && !tools.empty();
  if (*choice == "required") {
    if (!any_tools) throw invalid("tool_choice", "tool_choice: \"required\" needs tools, and the request has none");
    c.forced = true;
    return c;
  }
  if (!choice->is_object())
    throw invalid("tool_choice", "tool_choice: expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                                 "\"function\": {\"name\": ...}}, found " + choice->dump());
  const Fields named(*choice, "tool_choice");
  if (named.string("type").value_or("") != "function")
    throw invalid("tool_choice.type", "tool_choice.type: expected \"function\"");
  const json* function = named.get("function");
  if (!function || !function->is_object())
    throw invalid("tool_choice.function", "tool_choice.function: expected an object with the function's name");
  const auto name = Fields(*function, "tool_choice.function").string("name");
  if (!name || !any_tools || !has_function(tools, *name))
    throw invalid("tool_choice.function.name", "tool_choice.function.name: expected the name of one of the request's tools, found " +
                                                   (name ? "'" + *name + "'" : std::string("none")));
  c.forced = true;
  c.only = name;
  return c;
}

}  // namespace

ChatCompletionRequest parse_chat_request(const json& body, const RequestDefaults& defaults) {
  ChatCompletionRequest r;
  r.gen = parse_generation_fields(body, defaults, /*chat=*/true);
  const Fields f(body, "");
  r.messages = parse_messages(f);
  r.tools = parse_tools(f);
  const ToolChoice choice = parse_tool_choice(f, r.tools);
  r.parse_tool_calls = choice.calls && !r.tools.is_null();
  if (choice.forced) {
    if (r.gen.grammar)
      throw invalid("response_format", "response_format: a JSON format cannot be combined with a tool_choice that forces a call");
    r.gen.grammar = std::make_shared<grammar::Grammar>(tool_call_grammar(r.tools, choice.only, defaults.tool_call_form));
    r.gen.grammar_key = "tool_choice " + choice.only.value_or("") + " " + dump(r.tools);
  }
  if (const auto parallel = f.boolean("parallel_tool_calls"); parallel && !*parallel)
    throw invalid("parallel_tool_calls", "parallel_tool_calls: false is not supported");
  r.template_kwargs = parse_template_kwargs(f);
  return r;
}

}  // namespace petrel::server
