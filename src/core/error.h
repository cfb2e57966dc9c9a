// Errors are for people: every message names the file/tensor/field, what was expected and what was found.
#pragma once
#include <stdexcept>
#include <string>

namespace petrel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws petrel::Error with `message` when `condition` is false.
inline void check(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace petrel
