#include "server/submission.h"

#include "server/api_error.h"

namespace petrel::server {

Submission submit(ServedModel& model, std::vector<int32_t> prompt, const GenerationFields& fields,
                  std::unique_ptr<AnswerStream> answer, const char* param, std::optional<grammar::ReasoningTags> reasoning) {
  if (prompt.empty()) throw invalid(param, std::string(param) + ": the prompt has no tokens");
  model.check_fits(prompt.size(), param);
  Submission s;
  s.job = std::make_shared<CompletionJob>(std::move(answer), fields.logprobs >= 0);
  s.prompt_tokens = int(prompt.size());
  CompletionRequest request;
  request.prompt = std::move(prompt);
  request.sampling = fields.sampling;
  request.eos_ids = model.eos_ids();
  request.max_tokens = fields.max_tokens;
  request.top_logprobs = fields.logprobs;
  if (fields.grammar) {
    request.grammar = model.token_grammar(fields.grammar_key, *fields.grammar);
    request.reasoning = reasoning;
  }
  const auto on_event = [job = s.job](const StepEvent& e) { return job->on_event(e); };
  switch (model.scheduler().submit(std::move(request), on_event, &s.id)) {
    case SubmitStatus::Accepted: return s;
    case SubmitStatus::QueueFull:
      throw ApiError(429, "the server is busy (every slot is taken and the queue is full); retry later", "",
                     "queue_full");
    case SubmitStatus::PromptTooLong:
      throw ApiError(400, "the prompt is " + std::to_string(s.prompt_tokens) + " tokens, too long for the context of " +
                              std::to_string(model.context()), param, "context_length_exceeded");
    case SubmitStatus::ShuttingDown: break;
  }
  throw ApiError(503, "the server is shutting down", "", "shutting_down");
}

std::optional<ApiError> finish_error(const JobFinish& finish) {
  if (!finish.error.empty()) return ApiError(500, "generation failed: " + finish.error, "", "engine_error");
  if (finish.reason == FinishReason::Cancelled)
    return ApiError(503, "the request was cancelled: the server is shutting down", "", "shutting_down");
  return std::nullopt;
}

}  // namespace petrel::server
