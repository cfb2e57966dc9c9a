// An HTTP/1.1 server built so that no client can starve or exhaust it: one event loop reads every
// connection's request without holding a thread (a client that sends its head a byte at a time
// costs a buffer, not a worker), within size limits and deadlines; a fixed pool of workers runs
// the handlers of complete requests and writes their responses; connections beyond a bound get
// 503 at once; stopping closes idle and half-received connections at once and gives running
// handlers a grace period.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http/message.h"
#include "server/http/request_parser.h"

namespace petrel::http {

struct ServerLimits {
  ParseLimits parse;
  int max_connections = 1024;
  std::chrono::milliseconds head_timeout{10'000};   // from a connection's (re)start of waiting to its head's end
  std::chrono::milliseconds body_timeout{60'000};   // from the head's end to the body's end
  std::chrono::milliseconds write_timeout{30'000};  // a response write that makes no progress this long ends it
  int workers = 64;
};

using Handler = std::function<void(const Request&, Response&)>;

// One request answered: a response a worker wrote, or a refusal the server sent by itself.
struct Exchange {
  std::string method, path;  // as far as they were read ("" when not)
  std::string client;        // the peer's address and port: "127.0.0.1:50412", "[::1]:50412"
  int status = 0;
  std::chrono::steady_clock::duration took{};  // from the request's first byte to its response's last
  std::string note;                            // Response::log_note's text
};

class Server {
 public:
  // Shapes the answers the server gives by itself: malformed or oversized requests, deadlines,
  // unknown routes, too many connections.
  using ErrorResponder = std::function<Response(int status, const std::string& message)>;

  Server(ServerLimits limits, ErrorResponder errors);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void route(const std::string& method, const std::string& path, Handler handler);
  // Runs before every handler; returns true when it answered the request itself (e.g. 401).
  void before_routing(std::function<bool(const Request&, Response&)> hook) { before_ = std::move(hook); }
  // Runs once per request answered: on a worker after its response was written, and on the event
  // loop's thread for every request refused before it was whole (bad framing, limits, deadlines,
  // the connection bound).
  void after_exchange(std::function<void(const Exchange&)> hook) { after_ = std::move(hook); }

  // Binds and listens (port 0: any free port); returns the port. Throws petrel::Error naming the
  // address when it cannot.
  int bind(const std::string& host, int port);
  // The event loop and the workers, on threads of their own.
  void start();
  // Stops accepting and closes idle and half-received connections at once; handlers already
  // running may finish within `grace`, after which their connections are cut. Returns when every
  // thread has ended. Safe to call more than once.
  void stop(std::chrono::milliseconds grace);

  int open_connections() const { return open_.load(); }

 private:
  struct Connection;
  struct Job {
    std::unique_ptr<Connection> connection;
    Request request;
  };
  using Clock = std::chrono::steady_clock;

  // Event loop side.
  void loop();
  void accept_all();
  void pause_accepting(bool pause);
  void on_readable(Connection& c);
  bool advance(Connection& c);  // feeds buffered bytes; false when the connection left the loop
  void dispatch(int fd);
  void refuse(Connection& c, int status, const std::string& message);
  void close_in_loop(int fd);
  void expire(Clock::time_point now);
  void take_returned();
  void wake();

  // Worker side.
  void work();
  void serve(Job& job);
  void run_handler(const Request& req, Response& res);
  bool write_response(Connection& c, const Request& req, Response& res, bool keep_alive);
  void finish(std::unique_ptr<Connection> c, bool keep_alive);

  ServerLimits limits_;
  size_t buffer_budget_;  // bytes of unfinished requests held across all connections
  ErrorResponder errors_;
  std::map<std::string, std::map<std::string, Handler>> routes_;  // path -> method -> handler
  std::function<bool(const Request&, Response&)> before_;
  std::function<void(const Exchange&)> after_;

  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1;
  std::unordered_map<int, std::unique_ptr<Connection>> waiting_;  // owned by the loop thread
  size_t buffered_ = 0;                                           // loop thread only
  Clock::time_point accept_paused_until_{};
  std::atomic<int> open_{0};
  std::atomic<bool> stopping_{false}, cutting_{false};

  std::mutex mutex_;  // guards jobs_, returned_, busy_fds_, workers_idle_
  std::condition_variable job_ready_, idle_;
  std::deque<Job> jobs_;
  std::vector<std::unique_ptr<Connection>> returned_;
  std::set<int> busy_fds_;
  int busy_workers_ = 0;
  bool workers_quit_ = false;

  std::thread loop_thread_;
  std::vector<std::thread> workers_;
  std::once_flag stopped_;
};

}  // namespace petrel::http
