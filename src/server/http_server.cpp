#include "server/http_server.h"

#include <chrono>

#include "core/error.h"
#include "server/routes.h"

namespace petrel::server {
namespace {

// Compares every byte whatever the first difference, so response times do not leak the key.
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) diff |= uint8_t(given[i]) ^ uint8_t(expected[i % expected.size()]);
  return diff == 0;
}

// The error body for a status that httplib itself set (unknown route, body too large, ...).
ApiError error_for_status(int status, const std::string& path, size_t max_body_bytes) {
  switch (status) {
    case 404: return ApiError(404, "no route " + path, "", "not_found");
    case 405: return ApiError(405, "method not allowed on " + path, "", "method_not_allowed");
    case 413:
      return ApiError(413, "the request body exceeds " + std::to_string(max_body_bytes) + " bytes", "",
                      "request_too_large");
  }
  return ApiError(status, "the request could not be read (HTTP " + std::to_string(status) + ")");
}

}  // namespace

HttpServer::HttpServer(ServerState& state, HttpOptions options) : state_(state), options_(std::move(options)) {
  install_handlers();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::install_handlers() {
  const int threads = options_.threads;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_.set_payload_max_length(options_.max_body_bytes);
  http_.set_tcp_nodelay(true);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which lets a second server share the port.
  http_.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });  // a streamed token is a small write: send it now, not after the last one's ACK
  using Outcome = httplib::Server::HandlerResponse;
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) -> Outcome {
    if (options_.api_key.empty() || req.path == "/health") return Outcome::Unhandled;
    if (same_secret(req.get_header_value("Authorization"), "Bearer " + options_.api_key)) return Outcome::Unhandled;
    send_error(res, ApiError(401, "a valid API key is required: send \"Authorization: Bearer KEY\"", "",
                             "invalid_api_key"));
    return Outcome::Handled;
  });
  http_.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return Outcome::Unhandled;
    send_error(res, error_for_status(res.status, req.path, options_.max_body_bytes));
    return Outcome::Handled;
  }));
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, ApiError(500, "internal error"));
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    state_.metrics().count_request(req.path, res.status);
  });
  add_generation_routes(http_, state_);
  add_info_routes(http_, state_);
}

void HttpServer::start() {
  if (options_.port == 0) port_ = http_.bind_to_any_port(options_.host);
  else port_ = http_.bind_to_port(options_.host, options_.port) ? options_.port : -1;
  check(port_ > 0, "cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                       " (in use, or not an address of this machine)");
  thread_ = std::thread([this] {
    http_.listen_after_bind();
    listen_returned_ = true;
  });
  // httplib's stop() does nothing before the accept loop runs: wait for it, so a stop() that
  // follows at once is not lost.
  while (!http_.is_running() && !listen_returned_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void HttpServer::stop() {
  http_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace petrel::server
