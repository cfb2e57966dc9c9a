// The HTTP side of `petrel serve`: a cpp-httplib server with the routes, optional API-key
// authentication, a request-body limit and OpenAI-style error bodies for every 4xx/5xx.
#pragma once
#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>

#include "server/server_state.h"

namespace petrel::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                // 0: any free port (see HttpServer::port)
  std::string api_key;            // "": no authentication
  size_t max_body_bytes = 8 << 20;
  int threads = 64;               // connections served at once (a streaming response holds one)
};

class HttpServer {
 public:
  HttpServer(ServerState& state, HttpOptions options);
  ~HttpServer();

  // Binds (an Error when the address cannot be bound) and serves on a thread of its own.
  void start();
  int port() const { return port_; }
  // Stops accepting and ends open connections; returns when the serving thread has finished.
  void stop();

 private:
  void install_handlers();

  ServerState& state_;
  HttpOptions options_;
  httplib::Server http_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
  int port_ = 0;
};

}  // namespace petrel::server
