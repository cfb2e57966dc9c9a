// Server-sent events as OpenAI streams them: one "data: <json>" event per chunk, then
// "data: [DONE]".
#pragma once
#include <string>

#include "server/json_fields.h"

namespace petrel::server {

// "data: {...}\n\n". The JSON is written on one line (a newline inside would end the event).
std::string sse_event(const json& chunk);
// "data: [DONE]\n\n"
std::string sse_done();
// ": keep-alive\n\n", a comment clients ignore; writing it finds out whether the client is still there.
std::string sse_comment();

}  // namespace petrel::server
