// /v1/chat/completions: the shared fields plus messages, tools and template arguments.
#include "server/api_error.h"
#include "server/chat_messages.h"
#include "server/request.h"

namespace petrel::server {
namespace {

// "auto" and "none" only: "required" or a named function would need constrained decoding.
bool tool_choice_allows_calls(const Fields& f) {
  const json* choice = f.get("tool_choice");
  if (!choice) return true;
  if (choice->is_string() && (*choice == "auto" || *choice == "none")) return *choice == "auto";
  throw invalid("tool_choice", "tool_choice: only \"auto\" and \"none\" are supported, found " + choice->dump());
}

}  // namespace

ChatCompletionRequest parse_chat_request(const json& body, const RequestDefaults& defaults) {
  ChatCompletionRequest r;
  r.gen = parse_generation_fields(body, defaults, /*chat=*/true);
  const Fields f(body, "");
  r.messages = parse_messages(f);
  r.tools = parse_tools(f);
  r.parse_tool_calls = tool_choice_allows_calls(f) && !r.tools.is_null();
  if (const auto parallel = f.boolean("parallel_tool_calls"); parallel && !*parallel)
    throw invalid("parallel_tool_calls", "parallel_tool_calls: false is not supported");
  r.template_kwargs = parse_template_kwargs(f);
  return r;
}

}  // namespace petrel::server
