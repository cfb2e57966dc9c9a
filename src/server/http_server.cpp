#include "server/http_server.h"

#include <cstdio>

#include "core/error.h"
#include "server/request_log.h"
#include "server/routes.h"

namespace petrel::server {
namespace {

// Compares every byte whatever the first difference, so response times do not leak the key.
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) diff |= uint8_t(given[i]) ^ uint8_t(expected[i % expected.size()]);
  return diff == 0;
}

std::chrono::milliseconds millis(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000.0)); }

http::ServerLimits limits_of(const HttpOptions& o) {
  http::ServerLimits limits;
  limits.parse.max_body_bytes = o.max_body_bytes;
  limits.parse.max_head_bytes = o.max_header_bytes;
  limits.parse.max_headers = size_t(o.max_headers);
  limits.max_connections = o.max_connections;
  limits.head_timeout = millis(o.header_timeout_s);
  limits.body_timeout = millis(o.body_timeout_s);
  limits.write_timeout = millis(o.write_timeout_s);
  limits.workers = o.threads;
  return limits;
}

// OpenAI's error codes for the statuses the HTTP layer answers by itself.
const char* code_for_status(int status) {
  switch (status) {
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 408: return "request_timeout";
    case 413: return "request_too_large";
    case 415: return "unsupported_media_type";
    case 431: return "headers_too_large";
    case 503: return "overloaded";
  }
  return "invalid_request";
}

http::Response error_response(int status, const std::string& message) {
  http::Response res;
  send_error(res, ApiError(status, message, "", code_for_status(status)));
  return res;
}

}  // namespace

HttpServer::HttpServer(ServerState& state, HttpOptions options)
    : state_(state), options_(std::move(options)), http_(limits_of(options_), error_response) {
  install_handlers();
}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds(0)); }

void HttpServer::install_handlers() {
  http_.before_routing([this](const http::Request& req, http::Response& res) {
    if (options_.api_key.empty() || req.path == "/health") return false;
    if (same_secret(req.header_or_empty("authorization"), "Bearer " + options_.api_key)) return false;
    send_error(res, ApiError(401, "a valid API key is required: send \"Authorization: Bearer KEY\"", "",
                             "invalid_api_key"));
    return true;
  });
  http_.after_exchange([this](const http::Exchange& e) {
    state_.metrics().count_request(e.path, e.status);
    if (options_.log_requests)
      std::fprintf(stderr, "%s\n", request_log_line(e, std::chrono::system_clock::now()).c_str());
  });
  add_generation_routes(http_, state_);
  add_info_routes(http_, state_);
}

void HttpServer::start() {
  port_ = http_.bind(options_.host, options_.port);
  http_.start();
}

void HttpServer::stop(std::chrono::milliseconds grace) { http_.stop(grace); }

}  // namespace petrel::server
