// A request between scheduler and handler: events in (as the scheduler sends them), updates out;
// a stop string or a closed client ends the request at the event that brings it.
#include <gtest/gtest.h>

#include "server/completion_job.h"

namespace petrel::server {
namespace {

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::load(std::string(PETREL_SOURCE_DIR) + "/models/petrel-tiny");
  return t;
}
constexpr int32_t kEos = 2;  // <|im_end|>

std::vector<int32_t> ids(const std::string& text) {
  std::vector<int32_t> out;
  for (uint32_t id : tiny().encode(text)) out.push_back(int32_t(id));
  return out;
}

CompletionJob make_job(std::vector<std::string> stops, bool logprobs = false) {
  return CompletionJob(std::make_unique<AnswerStream>(tiny(), ThinkFilter(), std::move(stops), std::nullopt), logprobs);
}

StepEvent token(int32_t id) {
  StepEvent e;
  e.token = id;
  e.chosen = {id, -0.5f};
  e.top = {{id, -0.5f}, {7, -1.5f}};
  return e;
}

StepEvent last(int32_t id, FinishReason reason) {
  StepEvent e = token(id);
  e.done = true;
  e.reason = reason;
  return e;
}

TEST(CompletionJob, AnswerEndsAtEosWhichCountsButShowsNothing) {
  CompletionJob job = make_job({});
  const std::vector<int32_t> answer = ids("Answer: 57590");
  for (int32_t id : answer) EXPECT_TRUE(job.on_event(token(id)));
  EXPECT_FALSE(job.on_event(last(kEos, FinishReason::Eos)));
  const JobUpdate all = job.wait_all();
  EXPECT_EQ(all.delta.content, "Answer: 57590");
  ASSERT_TRUE(all.finish);
  EXPECT_EQ(all.finish->reason, FinishReason::Eos);
  EXPECT_EQ(all.finish->completion_tokens, int(answer.size()) + 1);
  EXPECT_GE(all.finish->ttft_s, 0.0);
  EXPECT_TRUE(all.logprobs.empty());  // not asked for
}

TEST(CompletionJob, AStopStringEndsTheRequestAtTheTokenThatCompletesIt) {
  CompletionJob job = make_job({"90"});
  const std::vector<int32_t> answer = ids("Answer: 57590 and more");
  size_t fed = 0;
  while (fed < answer.size() && job.on_event(token(answer[fed]))) ++fed;
  EXPECT_EQ(fed, ids("Answer: 5759").size());  // the "0" token completed the stop string
  const JobUpdate all = job.wait_all();
  EXPECT_EQ(all.delta.content, "Answer: 575");
  EXPECT_EQ(all.finish->reason, FinishReason::StopString);
  EXPECT_EQ(all.finish->completion_tokens, int(fed) + 1);
  EXPECT_FALSE(job.on_event(token(answer.back())));  // nothing is taken after the end
}

TEST(CompletionJob, UpdatesCarryWhatCameSinceTheLastLook) {
  CompletionJob job = make_job({}, /*logprobs=*/true);
  const std::vector<int32_t> first = ids("Answer:"), second = ids(" 4");
  for (int32_t id : first) job.on_event(token(id));
  JobUpdate u = job.next(std::chrono::milliseconds(0));
  EXPECT_EQ(u.delta.content, "Answer:");
  EXPECT_EQ(u.logprobs.size(), first.size());
  EXPECT_EQ(u.logprobs[0].top.size(), 2u);
  EXPECT_FALSE(u.finish);
  EXPECT_TRUE(job.next(std::chrono::milliseconds(0)).delta.empty());
  for (int32_t id : second) job.on_event(token(id));
  job.on_event(last(kEos, FinishReason::Eos));
  u = job.next(std::chrono::milliseconds(0));
  EXPECT_EQ(u.delta.content, " 4");
  EXPECT_EQ(u.logprobs.size(), second.size());  // EOS has no logprobs entry
  EXPECT_TRUE(u.finish);
}

TEST(CompletionJob, AClosedJobEndsAtTheNextEvent) {
  CompletionJob job = make_job({});
  EXPECT_TRUE(job.on_event(token(ids("A")[0])));
  job.close();
  EXPECT_FALSE(job.on_event(token(ids("n")[0])));
}

TEST(CompletionJob, EngineErrorsAndCancellationsEndTheJob) {
  CompletionJob failed = make_job({});
  StepEvent error;
  error.done = true;
  error.reason = FinishReason::Cancelled;
  error.error = "out of memory";
  EXPECT_FALSE(failed.on_event(error));
  const JobUpdate f = failed.wait_all();
  EXPECT_EQ(f.finish->error, "out of memory");
  EXPECT_EQ(f.finish->completion_tokens, 0);

  CompletionJob length = make_job({});
  EXPECT_FALSE(length.on_event(last(ids("A")[0], FinishReason::MaxTokens)));
  const JobUpdate l = length.wait_all();
  EXPECT_EQ(l.delta.content, "A");  // the last token of a length finish is text
  EXPECT_EQ(l.finish->reason, FinishReason::MaxTokens);
}

}  // namespace
}  // namespace petrel::server
