#include "server/chat_messages.h"

#include <set>

#include "server/api_error.h"
#include "tokenizer/chat_template.h"

namespace petrel::server {
namespace {

std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

// A string, or an array of {"type": "text", "text": ...} parts joined by newlines.
std::string content_text(const json& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw invalid(path, path + ": expected a string or an array of text parts, found " + type_name(content));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Fields part(content[i], at(path, i));
    const auto type = part.string("type");
    if (type != "text")
      throw invalid(part.name("type"), part.name("type") + ": only \"text\" parts are supported, found " +
                                           (type ? "\"" + *type + "\"" : std::string("none")));
    const auto piece = part.string("text");
    if (!piece) throw invalid(part.name("text"), part.name("text") + ": a text part needs its text");
    text += (i ? "\n" : "") + *piece;
  }
  return text;
}

// Arguments as an object when they are a JSON object written as a string; otherwise as given.
// Too deep a JSON text is refused: the template would walk it recursively.
json arguments_value(const json& arguments, const std::string& path) {
  if (!arguments.is_string()) return arguments;
  try {
    json parsed = parse_json_capped(arguments.get<std::string>());
    return parsed.is_object() ? parsed : arguments;
  } catch (const JsonTooDeep& e) {
    throw invalid(path, path + ": the arguments' JSON " + e.what());
  } catch (const json::exception&) {
    return arguments;
  }
}

json parse_tool_calls(const json& calls, const std::string& path) {
  if (!calls.is_array()) throw invalid(path, path + ": expected an array, found " + type_name(calls));
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const Fields call(calls[i], at(path, i));
    const json* function = call.get("function");
    if (!function) throw invalid(call.name("function"), call.name("function") + ": a tool call needs its function");
    const Fields fn(*function, call.name("function"));
    const auto name = fn.string("name");
    if (!name || name->empty()) throw invalid(fn.name("name"), fn.name("name") + ": a tool call needs a function name");
    const json* arguments = fn.get("arguments");
    if (arguments && !arguments->is_string() && !arguments->is_object())
      throw invalid(fn.name("arguments"), fn.name("arguments") + ": expected a JSON string or an object, found " +
                                              type_name(*arguments));
    const json value = arguments ? arguments_value(*arguments, fn.name("arguments")) : json::object();
    json normalized = {{"id", call.string("id").value_or("")},
                       {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", value}}}};
    out.push_back(std::move(normalized));
  }
  return out;
}

json parse_message(const json& value, const std::string& path) {
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  const Fields m(value, path);
  const auto role = m.string("role");
  if (!role) throw invalid(m.name("role"), m.name("role") + ": every message needs a role");
  if (!roles.count(*role))
    throw invalid(m.name("role"), m.name("role") + ": unknown role '" + *role +
                                      "' (expected system, developer, user, assistant or tool)");
  json out = {{"role", *role == "developer" ? "system" : *role}};
  const json* content = m.get("content");
  if (!content && *role != "assistant")
    throw invalid(m.name("content"), m.name("content") + ": a " + *role + " message needs content");
  out["content"] = content ? content_text(*content, m.name("content")) : "";
  if (auto name = m.string("name")) out["name"] = *name;
  if (*role == "assistant") {
    if (auto reasoning = m.string("reasoning_content")) out["reasoning_content"] = *reasoning;
    if (const json* calls = m.get("tool_calls")) out["tool_calls"] = parse_tool_calls(*calls, m.name("tool_calls"));
  }
  if (*role == "tool") {
    if (auto id = m.string("tool_call_id")) out["tool_call_id"] = *id;
  }
  return out;
}

void check_tool(const json& tool, const std::string& path) {
  const Fields t(tool, path);
  const auto type = t.string("type").value_or("function");
  if (type != "function") throw invalid(t.name("type"), t.name("type") + ": only \"function\" tools are supported");
  const json* function = t.get("function");
  if (!function) throw invalid(t.name("function"), t.name("function") + ": a tool needs its function");
  const Fields fn(*function, t.name("function"));
  const auto name = fn.string("name");
  if (!name || name->empty()) throw invalid(fn.name("name"), fn.name("name") + ": a function needs a name");
  fn.string("description");
  if (const json* parameters = fn.get("parameters"); parameters && !parameters->is_object())
    throw invalid(fn.name("parameters"), fn.name("parameters") + ": expected a JSON schema object, found " +
                                             type_name(*parameters));
}

}  // namespace

json parse_messages(const Fields& body) {
  const json* messages = body.get("messages");
  if (!messages) throw invalid("messages", "messages: required");
  if (!messages->is_array()) throw invalid("messages", "messages: expected an array, found " + type_name(*messages));
  if (messages->empty()) throw invalid("messages", "messages: at least one message is required");
  json out = json::array();
  for (size_t i = 0; i < messages->size(); ++i) out.push_back(parse_message((*messages)[i], at("messages", i)));
  return out;
}

json parse_tools(const Fields& body) {
  const json* tools = body.get("tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) throw invalid("tools", "tools: expected an array, found " + type_name(*tools));
  for (size_t i = 0; i < tools->size(); ++i) check_tool((*tools)[i], at("tools", i));
  return tools->empty() ? json() : *tools;
}

json parse_template_kwargs(const Fields& body) {
  const json* kwargs = body.get("chat_template_kwargs");
  if (!kwargs) return json::object();
  if (!kwargs->is_object())
    throw invalid("chat_template_kwargs", "chat_template_kwargs: expected an object, found " + type_name(*kwargs));
  for (const auto& item : kwargs->items()) {
    const std::string& key = item.key();
    const std::string name = "chat_template_kwargs." + key;
    // The validated messages (and the server's other render variables) must reach the template as they are.
    if (ChatTemplate::sets_variable(key))
      throw invalid(name, name + ": '" + key + "' is set by the server for the chat template (messages, tools, " +
                              "add_generation_prompt, special tokens, template functions) and cannot be replaced");
  }
  return *kwargs;
}

}  // namespace petrel::server
