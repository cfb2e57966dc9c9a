// The message Checkpoint::open gives for a path, or "" when it opens: loader error tests compare it.
#pragma once
#include <string>

#include "core/error.h"
#include "io/checkpoint.h"

namespace petrel::test {

inline std::string open_error(const std::string& path) {
  try {
    Checkpoint::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace petrel::test
