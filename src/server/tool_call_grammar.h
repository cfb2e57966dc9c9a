// tool_choice "required" or a named function: the grammar that makes the model write one call
// in the tool-call form its chat template uses, its arguments held to the tool's parameter schema.
#pragma once
#include <optional>
#include <string>

#include "grammar/grammar.h"
#include "server/json_fields.h"
#include "tokenizer/chat_template.h"

namespace petrel::server {

// How a checkpoint's chat template writes tool calls (tool_calls.h reads both).
enum class ToolCallForm {
  Json,  // <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen3, Hermes)
  Xml,   // <tool_call>\n<function=NAME>\n<parameter=P>...</function>\n</tool_call> (Qwen3.5)
};

// How `chat_template` writes an assistant's tool call, seen by rendering one (Json when the
// render fails).
ToolCallForm tool_call_form(const ChatTemplate& chat_template);

// One call of any of `tools` (the request's validated tools), or of the one named `only`, in
// `form`. A parameter schema the grammar compiler refuses is a 400 naming
// "tools[i].function.parameters..." and the keyword.
grammar::Grammar tool_call_grammar(const json& tools, const std::optional<std::string>& only, ToolCallForm form);

}  // namespace petrel::server
