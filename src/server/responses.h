// The JSON bodies OpenAI clients expect: chat.completion, chat.completion.chunk and
// text_completion objects, usage, tool calls and both logprobs forms (chat and legacy).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "petrel/tokenizer.h"
#include "server/completion_job.h"

namespace petrel::server {

// "stop", "length" or "tool_calls".
const char* finish_reason_text(const JobFinish& finish);
// OpenAI's usage object; cached_tokens: prompt tokens restored from the prefix cache.
json usage_json(int prompt_tokens, int completion_tokens, int cached_tokens);
// "chatcmpl-<24 hex digits>" for prefix "chatcmpl".
std::string random_id(const std::string& prefix);

// The fields every object of one response shares, and what numbering it needs across chunks.
class ResponseBuilder {
 public:
  // `chunk_object`: the "object" of streamed chunks ("chat.completion.chunk", "text_completion").
  ResponseBuilder(const Tokenizer& tokenizer, std::string model, std::string id_prefix, std::string chunk_object);
  virtual ~ResponseBuilder() = default;

  // The whole answer (non-streaming).
  virtual json whole(const JobUpdate& all, int prompt_tokens) = 0;
  // Streaming: the chunks for one update. `with_usage` adds "usage": null, as OpenAI does when
  // stream_options.include_usage is set.
  virtual std::vector<json> chunks(const JobUpdate& update, bool with_usage) = 0;
  // The last chunk of a stream with stream_options.include_usage: no choices, the usage.
  json usage_chunk(int prompt_tokens, int completion_tokens, int cached_tokens) const;

 protected:
  json envelope(const char* object) const;
  json chat_logprobs(const std::vector<TokenLogprobs>& tokens) const;
  // Legacy completions form; text offsets continue from earlier chunks.
  json legacy_logprobs(const std::vector<TokenLogprobs>& tokens);
  json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);

  const Tokenizer& tokenizer_;
  std::string model_, id_, chunk_object_;
  int64_t created_;
  size_t text_offset_ = 0;
  int tool_calls_sent_ = 0;
};

class ChatResponse : public ResponseBuilder {
 public:
  ChatResponse(const Tokenizer& tokenizer, std::string model, bool logprobs);
  json whole(const JobUpdate& all, int prompt_tokens) override;
  // The first call adds the role chunk; the update with the finish adds the finish chunk.
  std::vector<json> chunks(const JobUpdate& update, bool with_usage) override;

 private:
  json chunk(json delta, const json& logprobs, const json& finish_reason, bool with_usage) const;
  bool logprobs_, role_sent_ = false;
};

class TextResponse : public ResponseBuilder {
 public:
  TextResponse(const Tokenizer& tokenizer, std::string model, bool logprobs);
  json whole(const JobUpdate& all, int prompt_tokens) override;
  std::vector<json> chunks(const JobUpdate& update, bool with_usage) override;

 private:
  json choice(const std::string& text, const std::vector<TokenLogprobs>& logprobs, const json& finish_reason);
  bool logprobs_;
};

}  // namespace petrel::server
