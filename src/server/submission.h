// A generation request handed to the scheduler, and how its end is reported to the client.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "server/api_error.h"
#include "server/completion_job.h"
#include "server/request.h"
#include "server/served_model.h"

namespace petrel::server {

struct Submission {
  std::shared_ptr<CompletionJob> job;
  uint64_t id = 0;  // the scheduler's, for cancel()
  int prompt_tokens = 0;
};

// Submits `prompt` with the request's generation fields; `param` names the prompt field for a
// too-long prompt. Queue full is a 429, shutting down a 503. `reasoning`: the model's reasoning
// tags, after whose block a grammar starts (ThinkFilter::reasoning).
Submission submit(ServedModel& model, std::vector<int32_t> prompt, const GenerationFields& fields,
                  std::unique_ptr<AnswerStream> answer, const char* param,
                  std::optional<grammar::ReasoningTags> reasoning = std::nullopt);

// The error to report for a generation that did not end normally (engine error: 500; cancelled
// by a shutdown: 503), or nullopt.
std::optional<ApiError> finish_error(const JobFinish& finish);

}  // namespace petrel::server
