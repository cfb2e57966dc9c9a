// POST /v1/chat/completions and POST /v1/completions: parse, build the prompt, submit to the
// scheduler, then answer whole or as a stream of server-sent events.
#include "server/event_stream.h"
#include "server/request_log.h"
#include "server/routes.h"

namespace petrel::server {
namespace {

// Waits for the end (non-streaming) or hands the request to an EventStream.
void respond(ServerState& state, Submission submission, std::unique_ptr<ResponseBuilder> builder,
             const GenerationFields& fields, std::unique_ptr<ServerState::InFlight> in_flight, http::Response& res) {
  if (fields.stream) {
    auto stream = std::make_shared<EventStream>(state, std::move(submission), std::move(builder), fields.include_usage,
                                                std::move(in_flight));
    EventStream::attach(std::move(stream), res);
    return;
  }
  const JobUpdate all = submission.job->wait_all();
  state.metrics().count_finished(*all.finish);
  if (const auto error = finish_error(*all.finish)) throw *error;
  send_json(res, 200, builder->whole(all, submission.prompt_tokens));
  res.log_note = [note = token_note(submission.prompt_tokens, all.finish->completion_tokens)] { return note; };
}

void chat_completions(ServerState& state, const http::Request& req, http::Response& res) {
  ServedModel& model = ready_model(state);
  auto in_flight = std::make_unique<ServerState::InFlight>(state);
  const ChatCompletionRequest r = parse_chat_request(parse_body(req.body, model.defaults().max_json_depth), model.defaults());
  std::vector<int32_t> prompt = model.chat_prompt(r.messages, r.tools, r.template_kwargs, /*add_generation_prompt=*/true);
  std::optional<ToolCallParser> tools;
  if (r.parse_tool_calls) tools.emplace(r.tools);
  const ThinkFilter think(model.tokenizer(), prompt);
  auto answer = std::make_unique<AnswerStream>(model.tokenizer(), think, r.gen.stops, std::move(tools));
  Submission submission = submit(model, std::move(prompt), r.gen, std::move(answer), "messages", think.reasoning());
  auto builder = std::make_unique<ChatResponse>(model.tokenizer(), model.name(), r.gen.logprobs >= 0);
  respond(state, std::move(submission), std::move(builder), r.gen, std::move(in_flight), res);
}

void completions(ServerState& state, const http::Request& req, http::Response& res) {
  ServedModel& model = ready_model(state);
  auto in_flight = std::make_unique<ServerState::InFlight>(state);
  TextCompletionRequest r = parse_completion_request(parse_body(req.body, model.defaults().max_json_depth), model.defaults());
  std::vector<int32_t> prompt = r.prompt_ids.empty() ? model.encode(r.prompt) : std::move(r.prompt_ids);
  // Plain text in, plain text out: no reasoning split, no tool calls.
  auto answer = std::make_unique<AnswerStream>(model.tokenizer(), ThinkFilter(), r.gen.stops, std::nullopt);
  Submission submission = submit(model, std::move(prompt), r.gen, std::move(answer), "prompt");
  auto builder = std::make_unique<TextResponse>(model.tokenizer(), model.name(), r.gen.logprobs >= 0);
  respond(state, std::move(submission), std::move(builder), r.gen, std::move(in_flight), res);
}

}  // namespace

void add_generation_routes(http::Server& http, ServerState& state) {
  http.route("POST", "/v1/chat/completions",
            guarded([&state](const http::Request& req, http::Response& res) { chat_completions(state, req, res); }));
  http.route("POST", "/v1/completions",
            guarded([&state](const http::Request& req, http::Response& res) { completions(state, req, res); }));
}

}  // namespace petrel::server
