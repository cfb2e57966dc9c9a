// The HTTP side of `petrel serve`: the routes on Petrel's HTTP/1.1 server (server/http/), optional
// API-key authentication, the connection and request limits, OpenAI-style error bodies for every
// 4xx/5xx, and the request log.
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

#include "server/http/server.h"
#include "server/server_state.h"

namespace petrel::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                // 0: any free port (see HttpServer::port)
  std::string api_key;            // "": no authentication
  size_t max_body_bytes = 8 << 20;
  size_t max_header_bytes = 64 << 10;  // request line and headers together
  int max_headers = 100;
  int max_connections = 1024;     // beyond: 503 at once
  double header_timeout_s = 10;   // a request's head, from the connection's (re)start of waiting
  double body_timeout_s = 60;     // a request's body, from its head's end
  double write_timeout_s = 30;    // a response write that makes no progress
  int threads = 64;               // requests handled at once (a streaming response holds one)
  bool log_requests = true;       // one line per request answered on stderr (request_log.h)
};

class HttpServer {
 public:
  HttpServer(ServerState& state, HttpOptions options);
  ~HttpServer();

  // Binds (an Error naming the address when it cannot be bound) and serves on threads of its own.
  void start();
  int port() const { return port_; }
  // Stops accepting, closes idle and half-received connections, lets responses being written
  // finish within `grace`, then cuts the rest; returns when every thread has ended.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

 private:
  void install_handlers();

  ServerState& state_;
  HttpOptions options_;
  http::Server http_;
  int port_ = 0;
};

}  // namespace petrel::server
