#include "tokenizer/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_template.h"

namespace petrel {
namespace {

using nlohmann::ordered_json;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                              "sep_token", "cls_token", "mask_token"};
// What apply() itself sets besides the special tokens (and the engine's global functions).
constexpr const char* kRequestVariables[] = {"messages", "tools", "documents", "add_generation_prompt",
                                             "additional_special_tokens"};

// The special tokens transformers passes to templates: string values, or {"content": ...}.
ordered_json special_tokens_of(const ordered_json& config) {
  ordered_json out = ordered_json::object();
  for (const char* name : kSpecialTokenNames) {
    if (!config.contains(name)) continue;
    const auto& v = config[name];
    if (v.is_string()) out[name] = v;
    else if (v.is_object() && v.contains("content") && v["content"].is_string()) out[name] = v["content"];
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array())
    out["additional_special_tokens"] = config["additional_special_tokens"];
  return out;
}

std::map<std::string, std::string> templates_of(const ordered_json& value, const std::string& where) {
  std::map<std::string, std::string> named;
  if (value.is_string()) {
    named["default"] = value.get<std::string>();
  } else if (value.is_array()) {
    for (const auto& entry : value) {
      if (!entry.contains("name") || !entry.contains("template"))
        throw Error(where + ": each chat_template entry needs \"name\" and \"template\"");
      named[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
    }
  } else {
    throw Error(where + ": \"chat_template\" must be a string or a list of {name, template}");
  }
  return named;
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::filesystem::path& dir) {
  const auto config_path = dir / "tokenizer_config.json";
  ordered_json config = ordered_json::object();
  if (std::filesystem::exists(config_path)) {
    try {
      config = ordered_json::parse(read_text(config_path));
    } catch (const ordered_json::exception& e) {
      throw Error(config_path.string() + ": malformed JSON: " + e.what());
    }
  }
  std::map<std::string, std::string> named;
  const auto jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) named["default"] = read_text(jinja_path);
  else if (config.contains("chat_template")) named = templates_of(config["chat_template"], config_path.string());
  else
    throw Error("no chat template in " + dir.string() +
                " (expected chat_template.jinja or \"chat_template\" in tokenizer_config.json)");
  try {
    return ChatTemplate(named, special_tokens_of(config));
  } catch (const Error& e) {
    throw Error((std::filesystem::exists(jinja_path) ? jinja_path : config_path).string() + ": " + e.what());
  }
}

ChatTemplate::ChatTemplate(const std::map<std::string, std::string>& named, ordered_json special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  for (const auto& [name, source] : named) templates_[name] = std::make_shared<const jinja::Template>(source);
}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

bool ChatTemplate::sets_variable(const std::string& name) {
  const auto is_name = [&](const char* n) { return name == n; };
  if (std::any_of(std::begin(kSpecialTokenNames), std::end(kSpecialTokenNames), is_name) ||
      std::any_of(std::begin(kRequestVariables), std::end(kRequestVariables), is_name))
    return true;
  const auto globals = jinja::global_functions();
  return std::any_of(globals.begin(), globals.end(), [&](const auto& g) { return g.first == name; });
}

std::string ChatTemplate::apply(const ChatRequest& request) const {
  if (!request.messages.is_array() || request.messages.empty())
    throw Error("cannot apply the chat template to an empty conversation: give at least one message");
  const bool has_tools = !request.tools.is_null();
  auto it = has_tools && templates_.count("tool_use") ? templates_.find("tool_use") : templates_.find("default");
  if (it == templates_.end()) throw Error("the checkpoint's named chat templates include no \"default\"");

  jinja::Dict vars;
  for (const auto& [k, v] : special_tokens_.items()) vars.emplace_back(k, jinja::Value::from_json(v));
  vars.emplace_back("messages", jinja::Value::from_json(request.messages));
  vars.emplace_back("tools", jinja::Value::from_json(request.tools));
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value::from(request.add_generation_prompt));
  for (const auto& [k, v] : request.kwargs.items()) {
    if (sets_variable(k)) throw Error("template argument '" + k + "' would replace the variable the render sets itself");
    vars.emplace_back(k, jinja::Value::from_json(v));
  }
  return it->second->render(vars);
}

}  // namespace petrel
