#include "server/api_error.h"

namespace petrel::server {

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

const char* ApiError::type() const {
  switch (status_) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
  }
  return status_ >= 500 ? "server_error" : "invalid_request_error";
}

nlohmann::ordered_json ApiError::body() const {
  using json = nlohmann::ordered_json;
  const auto or_null = [](const std::string& s) { return s.empty() ? json() : json(s); };
  return {{"error", {{"message", what()}, {"type", type()}, {"param", or_null(param_)}, {"code", or_null(code_)}}}};
}

}  // namespace petrel::server
