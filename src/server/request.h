// Validated requests of the two completion endpoints, and the defaults they start from.
// Parsing turns every malformed field into an ApiError that names it (see api_error.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "generate/sampling_params.h"
#include "grammar/grammar.h"
#include "server/json_fields.h"
#include "server/tool_call_grammar.h"

namespace petrel::server {

// What the server knows before reading a request.
struct RequestDefaults {
  std::string model_name;  // the one model served; a request naming another is a 404
  SamplingParams sampling; // generation_config.json's, greedy when it says nothing
  int vocab = 0;           // model rows: token ids (prompt, logit_bias) must be below it
  int max_tokens = -1;     // when a request gives none; -1: until EOS or a full context
  int max_json_depth = kMaxJsonDepth;  // a request body nesting deeper is a 400
  ToolCallForm tool_call_form = ToolCallForm::Json;  // how the chat template writes tool calls
};

// Fields both endpoints share.
struct GenerationFields {
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  int max_tokens = -1;
  std::vector<std::string> stops;
  SamplingParams sampling;
  int logprobs = -1;  // -1: none; else how many alternatives to list beside each chosen token
  // Structured output (response_format json_object / json_schema, or a forced tool call): the
  // grammar the answer is held to; null: free text.
  std::shared_ptr<const grammar::Grammar> grammar;
  std::string grammar_key;  // what the grammar was compiled from: equal keys, equal grammars
};

struct ChatCompletionRequest {
  GenerationFields gen;
  json messages;            // normalized for the chat template (see chat_messages.h)
  json tools;               // null when the request has none
  bool parse_tool_calls = false;  // tools given and tool_choice is not "none"
  json template_kwargs = json::object();  // chat_template_kwargs, e.g. {"enable_thinking": false}
};

struct TextCompletionRequest {
  GenerationFields gen;
  std::string prompt;              // the prompt as text, when given as text
  std::vector<int32_t> prompt_ids; // the prompt as token ids, when given as ids
};

// A 404 (code model_not_found) when the body's "model" names another model than `served`.
void check_model_name(const Fields& body, const std::string& served);

// The shared fields; `chat` selects the endpoint's logprobs form (chat: logprobs bool +
// top_logprobs; completions: logprobs as a count).
GenerationFields parse_generation_fields(const json& body, const RequestDefaults& defaults, bool chat);

ChatCompletionRequest parse_chat_request(const json& body, const RequestDefaults& defaults);
TextCompletionRequest parse_completion_request(const json& body, const RequestDefaults& defaults);

}  // namespace petrel::server
