// The HTTP routes, registered on Petrel's HTTP server, and what their handlers share.
#pragma once

#include <functional>

#include "server/api_error.h"
#include "server/http/server.h"
#include "server/server_state.h"

namespace petrel::server {

// /v1/chat/completions and /v1/completions (routes_generate.cpp).
void add_generation_routes(http::Server& http, ServerState& state);
// /health, /metrics, /v1/models, /tokenize, /detokenize (routes_info.cpp).
void add_info_routes(http::Server& http, ServerState& state);

void send_json(http::Response& res, int status, const json& body);
void send_error(http::Response& res, const ApiError& error);

// `handler` with every exception turned into an error response: ApiError as itself, other
// petrel errors as 400, anything else as 500. Nothing a client sends may take the server down.
http::Handler guarded(http::Handler handler);

// The model, or a 503 while it loads or the server shuts down.
ServedModel& ready_model(const ServerState& state);

}  // namespace petrel::server
