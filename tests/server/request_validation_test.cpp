// Request validation: every malformed request of tests/server/bad_requests.json (also sent over
// HTTP by the OpenAI SDK test) is refused with its status and the field it names; the valid ones
// parse, and parsed values land where they belong.
#include <gtest/gtest.h>

#include <fstream>

#include "../unit/grammar_test_util.h"
#include "server/api_error.h"
#include "server/chat_messages.h"
#include "server/request.h"
#include "server/tool_calls.h"

namespace petrel::server {
namespace {

json table() {
  std::ifstream in(std::string(PETREL_SOURCE_DIR) + "/tests/server/bad_requests.json");
  return json::parse(in);
}

RequestDefaults tiny_defaults() {
  RequestDefaults d;
  d.model_name = "petrel-tiny";
  d.vocab = 384;
  d.sampling.temperature = 0.0f;
  return d;
}

// Parses a table entry as its endpoint would.
void parse(const json& entry) {
  const json body = entry.contains("raw") ? parse_body(entry["raw"].get<std::string>()) : entry["body"];
  if (entry["endpoint"] == "/v1/chat/completions") parse_chat_request(body, tiny_defaults());
  else parse_completion_request(body, tiny_defaults());
}

TEST(RequestValidation, EveryBadRequestGetsItsStatusAndNamesItsField) {
  const json bad = table()["bad"];
  ASSERT_GE(bad.size(), 20u);
  for (const json& entry : bad) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    try {
      parse(entry);
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), entry["status"].get<int>()) << e.what();
      EXPECT_EQ(e.body()["error"]["param"], entry["param"]) << e.what();
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
}

TEST(RequestValidation, TheValidRequestsOfTheTableParse) {
  for (const json& entry : table()["valid"]) EXPECT_NO_THROW(parse(entry)) << entry.dump();
}

TEST(RequestValidation, FieldsOverrideTheServerDefaults) {
  const json body = table()["valid"][1]["body"];
  const ChatCompletionRequest r = parse_chat_request(body, tiny_defaults());
  const SamplingParams& s = r.gen.sampling;
  EXPECT_FLOAT_EQ(s.temperature, 0.7f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 0);  // -1 means off
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.1f);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.logit_bias.at(3), -100.0f);
  EXPECT_EQ(r.gen.max_tokens, 8);
  EXPECT_EQ(r.gen.stops, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(r.gen.logprobs, 3);
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.gen.include_usage);
  EXPECT_EQ(r.template_kwargs, json({{"enable_thinking", false}}));
  EXPECT_EQ(r.messages[0]["role"], "system");  // developer
  EXPECT_EQ(r.messages[1]["content"], "What is\n2 + 2?");
}

TEST(RequestValidation, AbsentFieldsKeepTheDefaults) {
  RequestDefaults d = tiny_defaults();
  d.sampling.top_k = 20;
  d.max_tokens = 100;
  const ChatCompletionRequest r = parse_chat_request(table()["valid"][0]["body"], d);
  EXPECT_EQ(r.gen.sampling.top_k, 20);
  EXPECT_EQ(r.gen.max_tokens, 100);
  EXPECT_EQ(r.gen.logprobs, -1);
  EXPECT_FALSE(r.gen.stream);
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_FALSE(r.parse_tool_calls);
}

TEST(RequestValidation, ToolCallArgumentsBecomeObjectsForTheTemplate) {
  const ChatCompletionRequest r = parse_chat_request(table()["valid"][2]["body"], tiny_defaults());
  const json& call = r.messages[1]["tool_calls"][0];
  EXPECT_EQ(call["function"]["arguments"], json({{"city", "Oslo"}}));
  EXPECT_EQ(r.messages[1]["content"], "");
  EXPECT_EQ(r.messages[2]["tool_call_id"], "call_1");
  EXPECT_TRUE(r.parse_tool_calls);
  json none = table()["valid"][2]["body"];
  none["tool_choice"] = "none";
  EXPECT_FALSE(parse_chat_request(none, tiny_defaults()).parse_tool_calls);
}

TEST(RequestValidation, StructuredOutputFieldsSetTheAnswersGrammar) {
  const ChatCompletionRequest schema = parse_chat_request(table()["valid"][5]["body"], tiny_defaults());
  ASSERT_NE(schema.gen.grammar, nullptr);
  EXPECT_TRUE(test::grammar_matches(*schema.gen.grammar, R"({"sum": 4})"));
  EXPECT_FALSE(test::grammar_matches(*schema.gen.grammar, R"({"sum": 14})"));
  const ChatCompletionRequest forced = parse_chat_request(table()["valid"][6]["body"], tiny_defaults());
  ASSERT_NE(forced.gen.grammar, nullptr);
  EXPECT_TRUE(forced.parse_tool_calls);
  EXPECT_TRUE(test::grammar_matches(*forced.gen.grammar,
                                    "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"));
  EXPECT_FALSE(test::grammar_matches(*forced.gen.grammar, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"));
  RequestDefaults xml = tiny_defaults();
  xml.tool_call_form = ToolCallForm::Xml;
  json named = table()["valid"][6]["body"];
  named["tools"][0]["function"]["parameters"]["properties"]["note"] = {{"type", "string"}, {"maxLength", 5}};
  const ChatCompletionRequest qwen35 = parse_chat_request(named, xml);
  const std::string call = "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n";
  EXPECT_TRUE(test::grammar_matches(*qwen35.gen.grammar, call + "</function>\n</tool_call>"));
  EXPECT_TRUE(test::grammar_matches(*qwen35.gen.grammar, call + "<parameter=note>\na \"b\"\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(test::grammar_matches(*qwen35.gen.grammar, call + "<parameter=note>\nabcdef\n</parameter>\n</function>\n</tool_call>"));
  // What the grammar lets through, the tool-call parser reads back.
  const auto parsed = parse_tool_call(call.substr(11) + "<parameter=note>\na \"b\"\n</parameter>\n</function>\n", named["tools"]);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(json::parse(parsed->arguments), json({{"a", 1}, {"b", 2}, {"note", "a \"b\""}}));
  EXPECT_FALSE(test::grammar_matches(*qwen35.gen.grammar, "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"));
  json text = table()["valid"][5]["body"];
  text["response_format"] = {{"type", "text"}};
  EXPECT_EQ(parse_chat_request(text, tiny_defaults()).gen.grammar, nullptr);
}

TEST(RequestValidation, CompletionPromptsAsTextOrIds) {
  const TextCompletionRequest ids = parse_completion_request(table()["valid"][3]["body"], tiny_defaults());
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids.gen.logprobs, 2);
  EXPECT_EQ(ids.gen.stops, std::vector<std::string>{"x"});
  const TextCompletionRequest text = parse_completion_request(table()["valid"][4]["body"], tiny_defaults());
  EXPECT_EQ(text.prompt, "one prompt");
  EXPECT_EQ(text.gen.sampling.seed, ~uint64_t(0));  // -1 as 64 bits
}

TEST(RequestValidation, DeeplyNestedBodiesAreRefusedWhileParsing) {
  const std::string deep = "{\"prompt\": " + std::string(100, '[') + std::string(100, ']') + "}";
  try {
    parse_body(deep);
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("nests deeper"), std::string::npos);
  }
}

// The status and field of the ApiError `fn` throws ("" when it throws none).
template <class Fn>
std::pair<int, std::string> refusal(Fn fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return {e.status(), e.param() + " | " + e.code() + " | " + e.what()};
  }
  return {0, ""};
}

std::string brackets(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }

TEST(RequestValidation, BodiesNestDeeperThanTheLimitNamingWhere) {
  // The body is the first level: 63 arrays inside it make 64.
  EXPECT_NO_THROW(parse_body("{\"prompt\": " + brackets(kMaxJsonDepth - 1) + "}"));
  std::string where = "prompt";
  for (int i = 0; i < kMaxJsonDepth - 1; ++i) where += "[0]";
  const auto [status, what] = refusal([&] { parse_body("{\"prompt\": " + brackets(kMaxJsonDepth) + "}"); });
  EXPECT_EQ(status, 400);
  EXPECT_TRUE(what.starts_with(where + " | ")) << what;
  EXPECT_NE(what.find("deeper than 64 levels"), std::string::npos) << what;
  const auto [deep_status, deep_what] =
      refusal([&] { parse_body("{\"a\": [1, {\"b\": " + brackets(20000) + "}]}"); });
  EXPECT_EQ(deep_status, 400);
  EXPECT_TRUE(deep_what.starts_with("a[1].b[0][0]")) << deep_what;
}

TEST(RequestValidation, NumbersBeyondADoubleNameTheirField) {
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"temperature": 1e400})", "temperature"},
           {R"({"a": {"b": [0, 2, -1E+999]}})", "a.b[2]"},
           {R"({"logit_bias": {"5": 1e309}, "x": 1})", "logit_bias.5"}}) {
    const auto [status, what] = refusal([&] { parse_body(body); });
    EXPECT_EQ(status, 400) << body;
    EXPECT_TRUE(what.starts_with(field + " | invalid_json | " + field + ": expected a number within the range")) << what;
  }
  EXPECT_NO_THROW(parse_body(R"({"temperature": 1e-400, "big": 123456789012345678901234567890})"));
}

json with_arguments(const std::string& arguments) {
  json body = table()["valid"][2]["body"];
  body["messages"][1]["tool_calls"][0]["function"]["arguments"] = arguments;
  return body;
}

TEST(RequestValidation, ToolCallArgumentsNestedTooDeeplyAreRefused) {
  // The arguments object is the first level of their own JSON.
  const json within = parse_chat_request(with_arguments("{\"a\": " + brackets(kMaxJsonDepth - 1) + "}"), tiny_defaults())
                          .messages[1]["tool_calls"][0]["function"]["arguments"];
  EXPECT_TRUE(within.is_object());
  for (int depth : {kMaxJsonDepth, 20000}) {
    const auto [status, what] =
        refusal([&] { parse_chat_request(with_arguments("{\"a\": " + brackets(depth) + "}"), tiny_defaults()); });
    EXPECT_EQ(status, 400);
    EXPECT_TRUE(what.starts_with("messages[1].tool_calls[0].function.arguments | invalid_value | ")) << what;
    EXPECT_NE(what.find("deeper than 64 levels"), std::string::npos) << what;
  }
  // Arguments that are no JSON object stay the string they were.
  EXPECT_EQ(parse_chat_request(with_arguments("{\"a\": 1e400}"), tiny_defaults())
                .messages[1]["tool_calls"][0]["function"]["arguments"],
            "{\"a\": 1e400}");
}

TEST(RequestValidation, TemplateKwargsCannotReplaceWhatTheServerRenders) {
  json body = table()["valid"][0]["body"];
  for (const char* key : {"messages", "tools", "add_generation_prompt", "eos_token", "raise_exception"}) {
    body["chat_template_kwargs"] = {{key, json::array()}};
    const auto [status, what] = refusal([&] { parse_chat_request(body, tiny_defaults()); });
    EXPECT_EQ(status, 400);
    EXPECT_TRUE(what.starts_with(std::string("chat_template_kwargs.") + key + " | ")) << what;
  }
  body["chat_template_kwargs"] = {{"enable_thinking", false}, {"custom", "x"}};
  EXPECT_EQ(parse_chat_request(body, tiny_defaults()).template_kwargs, body["chat_template_kwargs"]);
}

TEST(RequestValidation, NumbersPastTheDoubleRangeAreInvalidJson) {
  // Found by request_to_ids_fuzz: nlohmann's out_of_range 406 escaped parse_body (a 500, not a 400).
  try {
    parse_body(R"({"prompt": [1, 21e308]})");
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "invalid_json");
    EXPECT_NE(std::string(e.what()).find("number overflow"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace petrel::server
