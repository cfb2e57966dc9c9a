// OpenAI-shaped conversations with tool calls and tool results render through real templates:
// Qwen3.5's iterates the call arguments (sent by clients as JSON text), Qwen3's writes them out.
#include <gtest/gtest.h>

#include "../unit/tokenizer_test_util.h"
#include "server/chat_messages.h"
#include "tokenizer/chat_template.h"

namespace petrel::server {
namespace {

// What an OpenAI client sends after its tool answered: the call's arguments as a JSON string.
const json kBody = json::parse(R"({
  "messages": [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
})");

std::string render(const ChatTemplate& tmpl) {
  const Fields body(kBody, "");
  ChatRequest request;
  request.messages = parse_messages(body);
  request.tools = parse_tools(body);
  request.add_generation_prompt = true;
  return tmpl.apply(request);
}

TEST(ChatMessages, ToolCallsAndResultsRenderThroughQwen35sTemplate) {
  const ChatTemplate tmpl({{"default", test::read_file(test::tokenizer_fixtures() / "qwen3_5_chat_template.jinja")}},
                          json::object());
  const std::string prompt = render(tmpl);
  EXPECT_NE(prompt.find("<|im_start|>system\n# Tools"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("\"name\": \"get_weather\""), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("Be brief."), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
                        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>"), std::string::npos)
      << prompt;
  EXPECT_TRUE(prompt.ends_with("<|im_start|>assistant\n<think>\n")) << prompt;
}

TEST(ChatMessages, ToolCallsAndResultsRenderThroughQwen3sTemplate) {
  if (!test::qwen3_available()) GTEST_FAIL() << test::kFetchHint;
  const std::string prompt = render(ChatTemplate::load(test::qwen3_dir()));
  EXPECT_NE(prompt.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n"
                        "</tool_call>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << prompt;
}

}  // namespace
}  // namespace petrel::server
