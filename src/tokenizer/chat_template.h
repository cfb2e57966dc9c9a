// A checkpoint's chat template, applied as transformers' apply_chat_template does.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace petrel::jinja {
class Template;
}

namespace petrel {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role": ..., "content": ...}, ...]
  nlohmann::ordered_json tools;                                       // null when the request has none
  bool add_generation_prompt = false;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();   // e.g. {"enable_thinking": false}
};

class ChatTemplate {
 public:
  // Reads DIR/chat_template.jinja when present, else "chat_template" of DIR/tokenizer_config.json
  // (a string, or a list of named templates), and the special-token strings of that config.
  static ChatTemplate load(const std::filesystem::path& dir);

  // `named` maps template names to sources ("default" is used unless tools pick "tool_use");
  // `special_tokens` become template variables (bos_token, eos_token, ...).
  ChatTemplate(const std::map<std::string, std::string>& named, nlohmann::ordered_json special_tokens);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // Throws petrel::Error when a kwarg names a variable the render sets itself (sets_variable).
  std::string apply(const ChatRequest& request) const;

  // Whether the render sets variable `name` itself: messages, tools, documents,
  // add_generation_prompt, the special-token strings (bos_token, ...) and the global functions
  // (raise_exception, range, ...). Template arguments must not replace them.
  static bool sets_variable(const std::string& name);

 private:
  std::map<std::string, std::shared_ptr<const jinja::Template>> templates_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace petrel
