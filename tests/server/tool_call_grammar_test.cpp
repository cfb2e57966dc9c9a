// Forced tool calls: the tool-call form read off each chat template, and a call written in that
// form by the Qwen3 tokenizer's own tokens passing the grammar's masks token by token, then read
// back by the tool-call parser with the arguments it was given.
#include <gtest/gtest.h>

#include "../unit/test_util.h"
#include "../unit/tokenizer_test_util.h"
#include "grammar/matcher.h"
#include "server/tool_call_grammar.h"
#include "server/tool_calls.h"

namespace petrel::server {
namespace {

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer",
    "minimum": 1, "maximum": 7}}, "required": ["city"]}}}])");

// Every token of `text` (as the tokenizer encodes it) is allowed when it comes, and then the end.
void expect_tokens_pass(const grammar::Grammar& g, const Tokenizer& tokenizer, const std::string& text) {
  auto vocab = std::make_shared<grammar::TokenVocab>(grammar::make_token_vocab(tokenizer, int(tokenizer.vocab_size())));
  const int32_t end = int32_t(*tokenizer.token_id("<|im_end|>"));
  grammar::Matcher m(std::make_shared<grammar::TokenGrammar>(g, vocab), {end});
  for (uint32_t id : tokenizer.encode(text)) {
    const uint32_t* mask = m.mask();
    ASSERT_TRUE((mask[id / 32] >> (id % 32)) & 1u) << "token " << id << " '" << tokenizer.token_bytes(id) << "'";
    m.accept(int32_t(id));
  }
  const uint32_t* mask = m.mask();
  EXPECT_TRUE((mask[end / 32] >> (end % 32)) & 1u);
}

TEST(ToolCallGrammar, TheFormComesFromTheTemplate) {
  const ChatTemplate qwen35({{"default", test::read_file(test::tokenizer_fixtures() / "qwen3_5_chat_template.jinja")}},
                            json::object());
  EXPECT_EQ(tool_call_form(qwen35), ToolCallForm::Xml);
  EXPECT_EQ(tool_call_form(ChatTemplate::load(test::tiny_model_dir())), ToolCallForm::Json);
  PETREL_REQUIRE_QWEN3();
  EXPECT_EQ(tool_call_form(ChatTemplate::load(test::qwen3_dir())), ToolCallForm::Json);
}

TEST(ToolCallGrammar, QwenTokensOfACallPassAndParseBack) {
  PETREL_REQUIRE_QWEN3();
  const std::string json_body = "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n";
  expect_tokens_pass(tool_call_grammar(kTools, std::nullopt, ToolCallForm::Json), test::qwen3(),
                     "<tool_call>" + json_body + "</tool_call>");
  const std::string xml_body = "\n<function=get_weather>\n<parameter=city>\nSan \"Jose\"\n</parameter>\n"
                               "<parameter=days>\n3\n</parameter>\n</function>\n";
  expect_tokens_pass(tool_call_grammar(kTools, "get_weather", ToolCallForm::Xml), test::qwen3(),
                     "<tool_call>" + xml_body + "</tool_call>");
  EXPECT_EQ(json::parse(parse_tool_call(json_body, kTools)->arguments), json({{"city", "Oslo"}, {"days", 3}}));
  EXPECT_EQ(json::parse(parse_tool_call(xml_body, kTools)->arguments), json({{"city", "San \"Jose\""}, {"days", 3}}));
}

}  // namespace
}  // namespace petrel::server
