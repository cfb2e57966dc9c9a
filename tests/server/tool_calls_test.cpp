// Tool calls in generated text: both Qwen forms parse, blocks are found however the text is cut
// into pieces, and what is not a readable call stays content.
#include <gtest/gtest.h>

#include "server/tool_calls.h"

namespace petrel::server {
namespace {

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}}}}
])");

// Feeds `text` in pieces of `piece` bytes; returns everything the parser produced.
ToolCallParser::Output feed(const std::string& text, size_t piece) {
  ToolCallParser parser(kTools);
  ToolCallParser::Output all;
  const auto take = [&](ToolCallParser::Output out) {
    all.content += out.content;
    for (auto& call : out.calls) all.calls.push_back(call);
  };
  for (size_t at = 0; at < text.size(); at += piece) take(parser.push(text.substr(at, piece)));
  take(parser.finish());
  return all;
}

TEST(ToolCalls, ParsesTheJsonForm) {
  const auto call = parse_tool_call("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n", kTools);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->name, "get_weather");
  EXPECT_EQ(json::parse(call->arguments), json({{"city", "Paris"}}));
}

TEST(ToolCalls, KeepsArgumentsGivenAsAString) {
  const auto call = parse_tool_call(R"({"name": "f", "arguments": "{\"x\": 1}"})", nullptr);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->arguments, "{\"x\": 1}");
}

TEST(ToolCalls, ParsesTheXmlFormWithTypesFromTheSchema) {
  const std::string block =
      "\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "<parameter=zip>\n10001\n</parameter>\n<parameter=notes>\nline one\nline two\n</parameter>\n</function>\n";
  const auto call = parse_tool_call(block, kTools);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->name, "get_weather");
  const json args = json::parse(call->arguments);
  EXPECT_EQ(args["city"], "New York");
  EXPECT_EQ(args["days"], 3);            // an integer parameter
  EXPECT_EQ(args["zip"], "10001");       // a string parameter that looks like a number
  EXPECT_EQ(args["notes"], "line one\nline two");  // not in the schema, not JSON: a string
}

TEST(ToolCalls, RejectsBlocksThatAreNeitherForm) {
  EXPECT_FALSE(parse_tool_call("{\"arguments\": {}}", kTools));  // no name
  EXPECT_FALSE(parse_tool_call("{\"name\": \"f\", \"arguments\": [1]}", kTools));
  EXPECT_FALSE(parse_tool_call("{\"name\": \"f\"", kTools));  // cut short
  EXPECT_FALSE(parse_tool_call("call get_weather(Paris)", kTools));
  EXPECT_FALSE(parse_tool_call("<function=f>\n<parameter=x>\n1\n</function>", kTools));  // parameter not closed
}

TEST(ToolCalls, FindsBlocksHoweverTheTextIsCut) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
  for (size_t piece : {1, 2, 3, 5, 7, 11, 1000}) {
    SCOPED_TRACE(piece);
    const auto out = feed(text, piece);
    EXPECT_EQ(out.content, "Let me check.\n");
    ASSERT_EQ(out.calls.size(), 2u);
    EXPECT_EQ(json::parse(out.calls[0].arguments)["city"], "Paris");
    EXPECT_EQ(json::parse(out.calls[1].arguments)["city"], "Oslo");
  }
}

TEST(ToolCalls, TextWithoutCallsPassesThroughWhole) {
  const std::string text = "a < b and <tool is not a tag; <tool_cal";
  for (size_t piece : {1, 4, 1000}) EXPECT_EQ(feed(text, piece).content, text);
}

TEST(ToolCalls, HoldsBackOnlyWhatMayStartATag) {
  ToolCallParser parser(kTools);
  EXPECT_EQ(parser.push("Hi <to").content, "Hi ");
  EXPECT_EQ(parser.push("ast>").content, "<toast>");
}

TEST(ToolCalls, UnreadableAndUnterminatedBlocksStayContent) {
  EXPECT_EQ(feed("<tool_call>not json</tool_call>", 3).content, "<tool_call>not json</tool_call>");
  const auto cut = feed("ok <tool_call>{\"name\": \"get_weather\"", 4);
  EXPECT_EQ(cut.content, "ok <tool_call>{\"name\": \"get_weather\"");
  EXPECT_TRUE(cut.calls.empty());
}

TEST(ToolCalls, CountsCallsAndDropsWhitespaceBetweenThem) {
  ToolCallParser parser(kTools);
  const std::string call = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  EXPECT_EQ(parser.push(call + "\n\n" + call + "\n").calls.size(), 2u);
  EXPECT_EQ(parser.finish().content, "");
  EXPECT_EQ(parser.calls_found(), 2);
}

TEST(ToolCalls, OddSchemasDoNotDisturbTheXmlForm) {
  const json odd = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"properties": "x"}}}, 3])");
  const auto call = parse_tool_call("<function=f>\n<parameter=a>\n1\n</parameter>\n</function>", odd);
  ASSERT_TRUE(call);
  EXPECT_EQ(json::parse(call->arguments)["a"], 1);
}

std::string nested(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }

// The model's text is parsed with the nesting cap: a block too deep to walk safely is no call.
TEST(ToolCalls, ModelJsonNestedTooDeeplyStaysContent) {
  const std::string deep = "{\"name\": \"f\", \"arguments\": {\"a\": " + nested(20000) + "}}";
  EXPECT_FALSE(parse_tool_call(deep, kTools));
  const auto out = feed("<tool_call>" + deep + "</tool_call>", 4096);
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.content, "<tool_call>" + deep + "</tool_call>");
  const std::string within = "{\"name\": \"f\", \"arguments\": {\"a\": " + nested(kMaxJsonDepth - 2) + "}}";
  EXPECT_TRUE(parse_tool_call(within, kTools));
}

TEST(ToolCalls, XmlValuesNestedTooDeeplyStayStrings) {
  const std::string value = nested(20000);
  const auto call = parse_tool_call("<function=get_weather>\n<parameter=days>\n" + value + "\n</parameter>\n</function>", kTools);
  ASSERT_TRUE(call);
  EXPECT_EQ(json::parse(call->arguments)["days"], value);
}

TEST(ToolCalls, InvalidUtf8InAnXmlParameterBecomesReplacementCharacters) {
  // Found by tool_call_parser_fuzz: serialising the arguments threw nlohmann's type_error 316.
  const auto call = parse_tool_call("<function=f>\n<parameter=city>\nOs\xe8lo\n</parameter>\n</function>", kTools);
  ASSERT_TRUE(call);
  EXPECT_EQ(json::parse(call->arguments)["city"], "Os\xef\xbf\xbdlo");
}

}  // namespace
}  // namespace petrel::server
