#include "server/sse.h"

namespace petrel::server {

std::string sse_event(const json& chunk) { return "data: " + dump(chunk) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_comment() { return ": keep-alive\n\n"; }

}  // namespace petrel::server
