// `petrel serve`'s request log: one line on stderr per request answered, refusals included,
// written when its response is complete:
//
//   2026-12-06T05:42:13.123Z POST /v1/chat/completions 200 prompt_tokens=23 completion_tokens=21 duration_ms=812.4 client=127.0.0.1:50412
#pragma once
#include <chrono>
#include <string>

#include "server/http/server.h"

namespace petrel::server {

std::string request_log_line(const http::Exchange& exchange, std::chrono::system_clock::time_point now);

// "prompt_tokens=23 completion_tokens=21"; the completion count is left out when negative (the
// answer broke off before its end was known).
std::string token_note(int prompt_tokens, int completion_tokens);

}  // namespace petrel::server
