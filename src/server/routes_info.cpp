// GET /health, GET /metrics, GET /v1/models, POST /tokenize, POST /detokenize.
#include <ctime>

#include "core/error.h"
#include "server/chat_messages.h"
#include "server/request.h"
#include "server/routes.h"

namespace petrel::server {
namespace {

void health(const ServerState& state, http::Response& res) {
  switch (state.phase()) {
    case Phase::Loading: return send_json(res, 503, {{"status", "loading"}});
    case Phase::Draining: return send_json(res, 503, {{"status", "shutting down"}});
    case Phase::Ready: return send_json(res, 200, {{"status", "ok"}});
  }
}

void metrics(ServerState& state, http::Response& res) {
  const ServedModel* model = state.phase() == Phase::Loading ? nullptr : state.model();
  const SchedulerMetrics scheduler = model ? model->scheduler_metrics() : SchedulerMetrics{};
  res.status = 200;
  res.content_type = "text/plain; version=0.0.4";
  res.body = state.metrics().render(model ? &scheduler : nullptr);
}

void models(const ServerState& state, http::Response& res, int64_t started) {
  const ServedModel& model = ready_model(state);
  const json entry = {{"id", model.name()},
                      {"object", "model"},
                      {"created", started},
                      {"owned_by", "petrel"},
                      {"max_model_len", model.context()}};
  send_json(res, 200, {{"object", "list"}, {"data", json::array({entry})}});
}

// {"prompt": text} or {"messages": [...], "tools", "chat_template_kwargs", "add_generation_prompt"}:
// the ids a completion request with the same fields would be given.
void tokenize(const ServerState& state, const http::Request& req, http::Response& res) {
  const ServedModel& model = ready_model(state);
  const json body = parse_body(req.body, model.defaults().max_json_depth);
  const Fields f(body, "");
  check_model_name(f, model.name());
  std::vector<int32_t> ids;
  if (f.get("messages")) {
    const bool generation_prompt = f.boolean("add_generation_prompt").value_or(true);
    ids = model.chat_prompt(parse_messages(f), parse_tools(f), parse_template_kwargs(f), generation_prompt);
  } else {
    const auto prompt = f.string("prompt");
    if (!prompt) throw invalid("prompt", "prompt: give \"prompt\" (a string) or \"messages\"");
    ids = model.encode(*prompt);
  }
  send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.context()}});
}

void detokenize(const ServerState& state, const http::Request& req, http::Response& res) {
  const ServedModel& model = ready_model(state);
  const json body = parse_body(req.body, model.defaults().max_json_depth);
  const Fields f(body, "");
  check_model_name(f, model.name());
  const json* tokens = f.get("tokens");
  if (!tokens || !tokens->is_array()) throw invalid("tokens", "tokens: expected an array of token ids");
  std::vector<uint32_t> ids;
  const int64_t vocab = model.tokenizer().vocab_size();
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& id = (*tokens)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
      throw invalid("tokens", "tokens[" + std::to_string(i) + "]: expected a token id in [0, " +
                                  std::to_string(vocab - 1) + "], found " + id.dump());
    ids.push_back(id.get<uint32_t>());
  }
  try {
    send_json(res, 200, {{"prompt", model.tokenizer().decode(ids)}});
  } catch (const Error& e) {  // an id inside the range that names no token
    throw invalid("tokens", std::string("tokens: ") + e.what());
  }
}

}  // namespace

void add_info_routes(http::Server& http, ServerState& state) {
  const int64_t started = int64_t(std::time(nullptr));
  http.route("GET", "/health", guarded([&state](const http::Request&, http::Response& res) { health(state, res); }));
  http.route("GET", "/metrics", guarded([&state](const http::Request&, http::Response& res) { metrics(state, res); }));
  http.route("GET", "/v1/models",
           guarded([&state, started](const http::Request&, http::Response& res) { models(state, res, started); }));
  http.route("POST", "/tokenize", guarded([&state](const http::Request& req, http::Response& res) { tokenize(state, req, res); }));
  http.route("POST", "/detokenize",
            guarded([&state](const http::Request& req, http::Response& res) { detokenize(state, req, res); }));
}

}  // namespace petrel::server
