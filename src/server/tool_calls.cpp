#include "server/tool_calls.h"

namespace petrel::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";

std::string_view trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag(std::string_view text, std::string_view tag) {
  for (size_t len = std::min(tag.size() - 1, text.size()); len > 0; --len)
    if (text.substr(text.size() - len) == tag.substr(0, len)) return len;
  return 0;
}

std::optional<ToolCall> parse_json_call(std::string_view body) {
  const json call = try_parse_json(body).value_or(json());
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return std::nullopt;
  const json arguments = call.contains("arguments") ? call["arguments"] : json::object();
  if (arguments.is_string()) return ToolCall{call["name"].get<std::string>(), arguments.get<std::string>()};
  if (!arguments.is_object()) return std::nullopt;
  return ToolCall{call["name"].get<std::string>(), arguments.dump()};
}

// `value[key]` when `value` is an object that has it, else null.
const json* child(const json* value, const char* key) {
  if (!value || !value->is_object()) return nullptr;
  const auto it = value->find(key);
  return it == value->end() ? nullptr : &*it;
}

// The JSON-schema type of parameter `param` of function `function`, "" when the tools do not say.
std::string parameter_type(const json& tools, const std::string& function, const std::string& param) {
  if (!tools.is_array()) return "";
  for (const json& tool : tools) {
    const json* fn = child(&tool, "function");
    const json* name = child(fn, "name");
    if (!name || *name != function) continue;
    const json* properties = child(child(fn, "parameters"), "properties");
    const json* type = child(child(properties, param.c_str()), "type");
    return type && type->is_string() ? type->get<std::string>() : "";
  }
  return "";
}

// A parameter's text as a JSON value: kept a string when the schema says so, or it is no JSON
// (or nests too deep).
json parameter_value(std::string_view text, const std::string& type) {
  if (type == "string") return std::string(text);
  return try_parse_json(text).value_or(json(std::string(text)));
}

// <function=NAME> <parameter=P>\nVALUE\n</parameter> ... </function>
std::optional<ToolCall> parse_xml_call(std::string_view body, const json& tools) {
  constexpr std::string_view kFunction = "<function=", kParam = "<parameter=", kParamEnd = "</parameter>";
  if (!body.starts_with(kFunction) || !body.ends_with("</function>")) return std::nullopt;
  const size_t name_end = body.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  const std::string name(trim(body.substr(kFunction.size(), name_end - kFunction.size())));
  if (name.empty()) return std::nullopt;
  json arguments = json::object();
  for (size_t at = body.find(kParam, name_end); at != std::string_view::npos; at = body.find(kParam, at)) {
    const size_t key_end = body.find('>', at);
    const size_t value_end = body.find(kParamEnd, key_end);
    if (key_end == std::string_view::npos || value_end == std::string_view::npos) return std::nullopt;
    const std::string key(trim(body.substr(at + kParam.size(), key_end - at - kParam.size())));
    std::string_view value = body.substr(key_end + 1, value_end - key_end - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);  // the template's own line breaks
    if (value.ends_with('\n')) value.remove_suffix(1);
    arguments[key] = parameter_value(value, parameter_type(tools, name, key));
    at = value_end + kParamEnd.size();
  }
  return ToolCall{name, dump(arguments)};  // values are raw model text: dump() survives invalid UTF-8
}

}  // namespace

std::optional<ToolCall> parse_tool_call(std::string_view block, const json& tools) {
  const std::string_view body = trim(block);
  return body.starts_with('{') ? parse_json_call(body) : parse_xml_call(body, tools);
}

void ToolCallParser::add_content(Output& out, std::string_view text) const {
  if (calls_found_ > 0 && trim(text).empty()) return;
  out.content.append(text);
}

void ToolCallParser::scan(Output& out) {
  for (;;) {
    const std::string_view tag = in_block_ ? kClose : kOpen;
    const size_t at = held_.find(tag);
    if (at == std::string::npos) break;
    if (in_block_) {
      const std::string_view block = std::string_view(held_).substr(0, at);
      if (auto call = parse_tool_call(block, tools_)) {
        out.calls.push_back(std::move(*call));
        ++calls_found_;
      } else {
        out.content += std::string(kOpen) + std::string(block) + std::string(kClose);
      }
    } else {
      add_content(out, std::string_view(held_).substr(0, at));
    }
    held_.erase(0, at + tag.size());
    in_block_ = !in_block_;
  }
  if (in_block_) return;  // a block's text waits for its closing tag
  const size_t release = held_.size() - partial_tag(held_, kOpen);
  add_content(out, std::string_view(held_).substr(0, release));
  held_.erase(0, release);
}

ToolCallParser::Output ToolCallParser::push(std::string_view text) {
  Output out;
  held_.append(text);
  scan(out);
  return out;
}

ToolCallParser::Output ToolCallParser::finish() {
  Output out;
  if (in_block_) out.content = std::string(kOpen) + held_;
  else add_content(out, held_);
  held_.clear();
  in_block_ = false;
  return out;
}

}  // namespace petrel::server
