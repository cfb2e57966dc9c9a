// Request validation: every malformed request of tests/server/bad_requests.json (also sent over
// HTTP by the OpenAI SDK test) is refused with its status and the field it names; the valid ones
// parse, and parsed values land where they belong.
#include <gtest/gtest.h>

#include <fstream>

#include "server/api_error.h"
#include "server/chat_messages.h"
#include "server/request.h"

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
