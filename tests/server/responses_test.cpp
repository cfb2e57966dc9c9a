// What goes on the wire: SSE framing, the chunk sequence of a streamed chat answer, the whole
// chat and completion objects, both logprobs forms, and the Prometheus exposition.
#include <gtest/gtest.h>

#include "server/metrics.h"
#include "server/responses.h"
#include "server/sse.h"

namespace petrel::server {
namespace {

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::load(std::string(PETREL_SOURCE_DIR) + "/models/petrel-tiny");
  return t;
}

int32_t id_of(const std::string& token) { return int32_t(tiny().encode(token).at(0)); }

JobUpdate update(const std::string& content, std::optional<FinishReason> reason = std::nullopt) {
  JobUpdate u;
  u.delta.content = content;
  if (reason) {
    u.finish = JobFinish{};
    u.finish->reason = *reason;
    u.finish->completion_tokens = 5;
  }
  return u;
}

TEST(Sse, EventsAreOneDataLineEachAndTheStreamEndsWithDone) {
  const std::string event = sse_event({{"text", "two\nlines"}});
  EXPECT_EQ(event, "data: {\"text\":\"two\\nlines\"}\n\n");
  EXPECT_EQ(event.find('\n'), event.size() - 2);  // the newline inside is escaped
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_comment().front(), ':');
  EXPECT_EQ(sse_comment().substr(sse_comment().size() - 2), "\n\n");
}

TEST(Sse, InvalidUtf8IsReplacedNotThrown) {
  EXPECT_EQ(dump(json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

TEST(ChatResponse, StreamsRoleThenTextThenTheFinish) {
  ChatResponse r(tiny(), "petrel-tiny", false);
  std::vector<json> chunks = r.chunks(update("Hel"), /*with_usage=*/true);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(chunks[1]["choices"][0]["delta"], json({{"content", "Hel"}}));
  EXPECT_TRUE(chunks[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunks[1].contains("usage") && chunks[1]["usage"].is_null());
  EXPECT_EQ(chunks[0]["id"], chunks[1]["id"]);
  chunks = r.chunks(update("lo", FinishReason::Eos), false);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chunks[1]["choices"][0]["delta"], json::object());
  EXPECT_FALSE(chunks[1].contains("usage"));
  const json usage = r.usage_chunk(7, 5, 4);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], json({{"prompt_tokens", 7},
                                  {"completion_tokens", 5},
                                  {"total_tokens", 12},
                                  {"prompt_tokens_details", {{"cached_tokens", 4}}}}));
}

TEST(ChatResponse, ToolCallsGetIdsIndicesAndTheirFinishReason) {
  ChatResponse r(tiny(), "m", false);
  JobUpdate u = update("", FinishReason::Eos);
  u.delta.tool_calls = {{"get_weather", "{\"city\":\"Paris\"}"}, {"get_time", "{}"}};
  u.finish->tool_calls = 2;
  const json whole = r.whole(u, 3);
  const json& message = whole["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_NE(message["tool_calls"][0]["id"], message["tool_calls"][1]["id"]);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");

  ChatResponse streamed(tiny(), "m", false);
  const std::vector<json> chunks = streamed.chunks(u, false);
  const json& calls = chunks[1]["choices"][0]["delta"]["tool_calls"];
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[1]["index"], 1);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ChatResponse, WholeAnswerWithReasoningUsageAndLogprobs) {
  ChatResponse r(tiny(), "petrel-tiny", true);
  JobUpdate u = update("4", FinishReason::MaxTokens);
  u.delta.reasoning = "2 + 2";
  u.logprobs = {{{23, -0.25f}, {{23, -0.25f}, {24, -2.0f}}}};
  const json whole = r.whole(u, 10);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["model"], "petrel-tiny");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "4");
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning_content"], "2 + 2");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["total_tokens"], 15);
  const json& entry = whole["choices"][0]["logprobs"]["content"][0];
  const uint32_t id23[] = {23};
  EXPECT_EQ(entry["token"], tiny().decode(id23));
  EXPECT_EQ(entry["logprob"], -0.25);
  EXPECT_EQ(entry["bytes"].size(), tiny().token_bytes(23).size());
  EXPECT_EQ(entry["top_logprobs"].size(), 2u);
  EXPECT_EQ(entry["top_logprobs"][1]["logprob"], -2.0);
}

TEST(TextResponse, LegacyLogprobsWithOffsetsAcrossChunks) {
  TextResponse r(tiny(), "petrel-tiny", true);
  JobUpdate first = update("ab");
  first.logprobs = {{{id_of("a"), -0.5f}, {}}, {{id_of("b"), -1e30f}, {}}};
  const json c1 = r.chunks(first, false)[0];
  EXPECT_EQ(c1["object"], "text_completion");
  EXPECT_EQ(c1["choices"][0]["text"], "ab");
  const json& lp = c1["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -9999.0}));  // clamped like OpenAI
  EXPECT_EQ(lp["text_offset"], json({0, 1}));
  JobUpdate second = update("c", FinishReason::Eos);
  second.logprobs = {{{id_of("c"), -0.1f}, {{id_of("c"), -0.1f}}}};
  const json c2 = r.chunks(second, false)[0];
  EXPECT_EQ(c2["choices"][0]["logprobs"]["text_offset"], json({2}));
  EXPECT_EQ(c2["choices"][0]["logprobs"]["top_logprobs"][0], json({{"c", -0.1f}}));
  EXPECT_EQ(c2["choices"][0]["finish_reason"], "stop");
}

TEST(TextResponse, WholeCompletion) {
  TextResponse r(tiny(), "petrel-tiny", false);
  const json whole = r.whole(update("57590", FinishReason::StopString), 12);
  EXPECT_EQ(whole["choices"][0]["text"], "57590");
  EXPECT_TRUE(whole["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(whole["usage"]["prompt_tokens"], 12);
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(5.0);
  EXPECT_EQ(h.render("x"),
            "x_bucket{le=\"0.1\"} 1\nx_bucket{le=\"1\"} 2\nx_bucket{le=\"+Inf\"} 3\nx_sum 5.55\nx_count 3\n");
}

TEST(Metrics, ExpositionHasRequestsLatenciesAndSchedulerGauges) {
  ServerMetrics m;
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/no/such/route", 404);
  JobFinish f;
  f.reason = FinishReason::Eos;
  f.completion_tokens = 3;
  f.ttft_s = 0.02;
  f.tpot_s = 0.004;
  m.count_finished(f);
  SchedulerMetrics s;
  s.slots_in_use = 2;
  s.kv_tokens_in_use = 321;
  s.prefix_cache = {.host_hit_tokens = 128, .spills = 3, .host_bytes = 4096, .host_entries = 2};
  const std::string text = m.render(&s);
  EXPECT_NE(text.find("petrel_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("petrel_http_requests_total{route=\"other\",status=\"404\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("petrel_requests_finished_total{reason=\"stop\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("petrel_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("petrel_time_per_output_token_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(text.find("petrel_slots_in_use 2\n"), std::string::npos);
  EXPECT_NE(text.find("petrel_kv_tokens_in_use 321\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE petrel_batch_size gauge\n"), std::string::npos);
  EXPECT_NE(text.find("petrel_prefix_cache_host_hits_total 128\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE petrel_prefix_cache_spills_total counter\npetrel_prefix_cache_spills_total 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE petrel_prefix_cache_host_bytes gauge\npetrel_prefix_cache_host_bytes 4096\n"),
            std::string::npos);
  EXPECT_NE(text.find("petrel_prefix_cache_host_entries 2\n"), std::string::npos);
}

}  // namespace
}  // namespace petrel::server
