// Errors of the chat-template engine: every message names the template line.
#pragma once
#include <string>

#include "core/error.h"

namespace petrel::jinja {

[[noreturn]] inline void fail(int line, const std::string& message) {
  throw Error("chat template line " + std::to_string(line) + ": " + message);
}

}  // namespace petrel::jinja
