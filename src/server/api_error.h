// Errors a client caused (or is told about), shaped as OpenAI's error object:
// {"error": {"message", "type", "param", "code"}}. `param` names the request field at fault.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace petrel::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // OpenAI's "type" for the status: invalid_request_error, authentication_error, ...
  const char* type() const;
  nlohmann::ordered_json body() const;

 private:
  int status_;
  std::string param_, code_;
};

// 400 naming `param`: the usual answer to a field with the wrong type or value.
inline ApiError invalid(const std::string& param, const std::string& message) {
  return ApiError(400, message, param, "invalid_value");
}

}  // namespace petrel::server
