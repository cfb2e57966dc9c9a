// The reasoning split as a client sees it: <think> ... </think> becomes reasoning_content, the
// rest content, with stop strings and tool calls applied to the answer only, token by token.
#include <gtest/gtest.h>

#include "../unit/tokenizer_test_util.h"
#include "server/answer_stream.h"

namespace petrel::server {
namespace {

std::vector<int32_t> ids(const std::string& text) {
  std::vector<int32_t> out;
  for (uint32_t id : test::qwen3().encode(text)) out.push_back(int32_t(id));
  return out;
}

struct Streamed {
  Delta all;
  std::vector<Delta> per_token;
  bool stopped = false;
};

Streamed stream(const std::string& prompt, const std::string& answer, std::vector<std::string> stops, bool tools) {
  std::optional<ToolCallParser> parser;
  if (tools) parser.emplace(nullptr);
  AnswerStream s(test::qwen3(), ThinkFilter(test::qwen3(), ids(prompt)), std::move(stops), std::move(parser));
  Streamed out;
  for (int32_t id : ids(answer)) {
    Delta d;
    out.stopped = !s.push(id, d);
    out.per_token.push_back(d);
    if (out.stopped) break;
  }
  Delta last;
  s.finish(last);
  out.per_token.push_back(last);
  for (Delta d : out.per_token) out.all.append(std::move(d));
  return out;
}

class ReasoningSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::qwen3_available()) GTEST_FAIL() << test::kFetchHint;
  }
};

TEST_F(ReasoningSplit, ThinkTagsSeparateReasoningFromContent) {
  const Streamed s = stream("<|im_start|>assistant\n", "<think>\nAdd the units.\n</think>\n\nIt is 4.", {}, false);
  EXPECT_EQ(s.all.reasoning, "Add the units.\n");
  EXPECT_EQ(s.all.content, "It is 4.");
  // Streamed: no token carries both (the tags switch the channel between them).
  for (const Delta& d : s.per_token) EXPECT_TRUE(d.reasoning.empty() || d.content.empty());
}

TEST_F(ReasoningSplit, APromptThatOpensTheBlockStartsInReasoning) {
  const Streamed s = stream("<|im_start|>assistant\n<think>\n", "Hmm.\n</think>\n\nFour.", {}, false);
  EXPECT_EQ(s.all.reasoning, "Hmm.\n");
  EXPECT_EQ(s.all.content, "Four.");
}

TEST_F(ReasoningSplit, ThinkingSwitchedOffLeavesOnlyContent) {
  const Streamed s = stream("<|im_start|>assistant\n<think>\n\n</think>\n\n", "Four.", {}, false);
  EXPECT_EQ(s.all.reasoning, "");
  EXPECT_EQ(s.all.content, "Four.");
}

TEST_F(ReasoningSplit, StopStringsApplyToTheAnswerOnly) {
  const Streamed s =
      stream("<|im_start|>assistant\n", "<think>\nI will say END now.\n</think>\n\nThe sum END is here", {"END"}, false);
  EXPECT_EQ(s.all.reasoning, "I will say END now.\n");
  EXPECT_EQ(s.all.content, "The sum ");
  EXPECT_TRUE(s.stopped);
}

TEST_F(ReasoningSplit, ToolCallsAfterReasoningBecomeCalls) {
  const Streamed s = stream("<|im_start|>assistant\n",
                            "<think>\nNeed the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
                            "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                            {}, true);
  EXPECT_EQ(s.all.reasoning, "Need the weather.\n");
  EXPECT_EQ(s.all.content, "");
  ASSERT_EQ(s.all.tool_calls.size(), 1u);
  EXPECT_EQ(s.all.tool_calls[0].name, "get_weather");
}

TEST_F(ReasoningSplit, WithoutToolsTheTagsAreContent) {
  const Streamed s = stream("<|im_start|>assistant\n", "<tool_call>{\"name\": \"f\"}</tool_call>", {}, false);
  EXPECT_EQ(s.all.content, "<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(s.all.tool_calls.empty());
}

}  // namespace
}  // namespace petrel::server
