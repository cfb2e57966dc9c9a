// Qwen-style tool calls in generated text: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
// (Qwen3, Hermes) or <tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>
// (Qwen3.5, Qwen3-Coder), split from the answer text as it streams.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_fields.h"

namespace petrel::server {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object as text, as OpenAI's "arguments"
};

// The call a <tool_call> block holds, or nullopt when it is neither form (JSON nesting deeper
// than kMaxJsonDepth counts as neither). `tools` (the request's, or null) gives parameter types
// for the XML form: values of non-string parameters are read as JSON.
std::optional<ToolCall> parse_tool_call(std::string_view block, const json& tools);

class ToolCallParser {
 public:
  struct Output {
    std::string content;          // text outside tool-call blocks
    std::vector<ToolCall> calls;  // blocks completed by this piece
  };

  explicit ToolCallParser(json tools) : tools_(std::move(tools)) {}

  // Adds answer text. Text that may begin a <tool_call> tag is held back until it is known.
  Output push(std::string_view text);
  // The answer ended: held text is content, and so is an unterminated or unreadable block.
  Output finish();
  int calls_found() const { return calls_found_; }

 private:
  void scan(Output& out);
  // Text outside blocks: after the first call, whitespace between calls is dropped.
  void add_content(Output& out, std::string_view text) const;

  json tools_;
  std::string held_;
  bool in_block_ = false;
  int calls_found_ = 0;
};

}  // namespace petrel::server
