#include "server/http/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace petrel::http {
namespace {

using namespace std::chrono_literals;

constexpr size_t kReadSize = 64 << 10;
// How long a refused connection's further bytes are read and dropped, so that the client reads
// the refusal instead of a reset.
constexpr auto kLinger = 1000ms;
constexpr int kListenBacklog = 1024;

std::string status_line(int status) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
}

// The head of a response; `length` < 0 means a streamed body.
std::string response_head(const Response& res, long long length, bool chunked, bool keep_alive) {
  std::string head = status_line(res.status);
  if (!res.content_type.empty()) head += "Content-Type: " + res.content_type + "\r\n";
  for (const auto& [name, value] : res.headers) head += name + ": " + value + "\r\n";
  if (length >= 0) head += "Content-Length: " + std::to_string(length) + "\r\n";
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return head;
}

// Sends all of `data` on a non-blocking socket, waiting for room at most `timeout` at a time.
bool send_all(int fd, std::string_view data, std::chrono::milliseconds timeout, const std::atomic<bool>& cut) {
  while (!data.empty()) {
    if (cut) return false;
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, int(timeout.count())) <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
  }
  return true;
}

// Writes what fits now and no more: the loop thread never waits on a client.
void send_now(int fd, std::string_view data) { (void)!::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT); }

bool keep_alive_asked(const Request& req) {
  const std::string* connection = req.header("connection");
  std::string value = connection ? *connection : "";
  for (char& ch : value) ch = char(std::tolower(uint8_t(ch)));
  if (req.minor_version == 0) return value.find("keep-alive") != std::string::npos;
  return value.find("close") == std::string::npos;
}

// Chunked transfer coding for a streamed body (HTTP/1.1), or the raw bytes (HTTP/1.0, which then
// ends the body by closing the connection).
class SocketSink : public StreamSink {
 public:
  SocketSink(int fd, bool chunked, std::chrono::milliseconds timeout, const std::atomic<bool>& cut)
      : fd_(fd), chunked_(chunked), timeout_(timeout), cut_(cut) {}

  bool write(std::string_view data) override {
    if (failed_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    if (chunked_) {
      char size[20];
      const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      failed_ = !send_all(fd_, std::string_view(size, size_t(n)), timeout_, cut_) ||
                !send_all(fd_, data, timeout_, cut_) || !send_all(fd_, "\r\n", timeout_, cut_);
    } else {
      failed_ = !send_all(fd_, data, timeout_, cut_);
    }
    return !failed_;
  }
  bool end() { return failed_ ? false : !chunked_ || send_all(fd_, "0\r\n\r\n", timeout_, cut_); }
  bool failed() const { return failed_; }

 private:
  int fd_;
  bool chunked_;
  std::chrono::milliseconds timeout_;
  const std::atomic<bool>& cut_;
  bool failed_ = false;
};

// "127.0.0.1:50412" or "[::1]:50412".
std::string address_text(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(address);
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
}

// More descriptors than the default soft limit (1024) may be needed for the connection bound.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

struct Server::Connection {
  Connection(int fd, ParseLimits limits, std::string client) : fd(fd), parser(limits), client(std::move(client)) {}
  int fd;
  RequestParser parser;
  std::string client;      // the peer's address, for the request log
  Clock::time_point started;  // the current request's first byte
  std::string pending;     // received bytes the parser has not taken yet (a pipelined request)
  size_t counted = 0;      // bytes of this connection in the server's buffer budget
  Clock::time_point deadline;
  bool in_body = false;
  bool continue_sent = false;
  bool lingering = false;  // refused: drop what still arrives until the deadline, then close
};

Server::Server(ServerLimits limits, ErrorResponder errors)
    : limits_(limits),
      buffer_budget_(std::max<size_t>(size_t(64) << 20, limits.parse.max_body_bytes * 32)),
      errors_(std::move(errors)) {}

Server::~Server() { stop(0ms); }

void Server::route(const std::string& method, const std::string& path, Handler handler) {
  routes_[path][method] = std::move(handler);
}

int Server::bind(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    throw Error("cannot listen on " + where + ": not an address of this machine");
  std::string why = "no usable address";
  for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // not SO_REUSEPORT: one server per port
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, kListenBacklog) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) throw Error("cannot listen on " + where + " (" + why + ")");
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

void Server::start() {
  check(listen_fd_ >= 0, "Server::start: bind first");
  raise_descriptor_limit();
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  check(epoll_fd_ >= 0 && wake_fd_ >= 0, std::string("cannot start the HTTP event loop: ") + std::strerror(errno));
  epoll_event listen_event{EPOLLIN, {.fd = listen_fd_}};
  epoll_event wake_event{EPOLLIN, {.fd = wake_fd_}};
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &listen_event);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake_event);
  for (int i = 0; i < limits_.workers; ++i) workers_.emplace_back([this] { work(); });
  loop_thread_ = std::thread([this] { loop(); });
}

void Server::stop(std::chrono::milliseconds grace) {
  std::call_once(stopped_, [&] {
    stopping_ = true;
    if (loop_thread_.joinable()) {
      wake();
      const auto deadline = Clock::now() + grace;
      std::unique_lock lock(mutex_);
      idle_.wait_until(lock, deadline, [&] { return jobs_.empty() && busy_workers_ == 0; });
      cutting_ = true;  // writes in progress fail from now on
      for (int fd : busy_fds_) ::shutdown(fd, SHUT_RDWR);
      workers_quit_ = true;
      job_ready_.notify_all();
    }
    for (auto& w : workers_) w.join();
    wake();
    if (loop_thread_.joinable()) loop_thread_.join();
    for (int* fd : {&listen_fd_, &epoll_fd_, &wake_fd_})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  });
}

void Server::wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

// ---- the event loop: accepting, reading requests, deadlines ----

void Server::pause_accepting(bool pause) {
  epoll_event event{pause ? 0u : uint32_t(EPOLLIN), {.fd = listen_fd_}};
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &event);
  accept_paused_until_ = pause ? Clock::now() + 100ms : Clock::time_point{};
}

void Server::loop() {
  epoll_event events[256];
  bool listening = true;
  while (true) {
    if (stopping_ && listening) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
      listening = false;
      while (!waiting_.empty()) close_in_loop(waiting_.begin()->first);  // idle and half-received
    }
    if (stopping_ && workers_quit_) {
      std::lock_guard lock(mutex_);
      if (busy_workers_ == 0 && jobs_.empty()) break;
    }
    const int n = ::epoll_wait(epoll_fd_, events, 256, 100);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        accept_all();
      } else if (fd == wake_fd_) {
        uint64_t count;
        (void)!::read(wake_fd_, &count, sizeof count);
      } else if (auto it = waiting_.find(fd); it != waiting_.end()) {
        on_readable(*it->second);
      }
    }
    take_returned();
    const auto now = Clock::now();
    if (listening && accept_paused_until_ != Clock::time_point{} && now >= accept_paused_until_) pause_accepting(false);
    expire(now);
  }
  std::lock_guard lock(mutex_);
  for (auto& c : returned_) ::close(c->fd), --open_;
  returned_.clear();
}

void Server::accept_all() {
  while (true) {
    sockaddr_storage peer{};
    socklen_t peer_length = sizeof peer;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors: leave the backlog alone for a moment rather than spin on it.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) pause_accepting(true);
      return;
    }
    if (open_ >= limits_.max_connections) {
      const Response res = errors_(503, "the server has " + std::to_string(limits_.max_connections) +
                                            " connections open, its limit; try again later");
      send_now(fd, response_head(res, (long long)res.body.size(), false, false) + res.body);
      ::close(fd);
      if (after_) after_(Exchange{"", "", address_text(peer), 503, {}, ""});
      continue;
    }
    int yes = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);  // a streamed token is a small write
    auto c = std::make_unique<Connection>(fd, limits_.parse, address_text(peer));
    c->deadline = Clock::now() + limits_.head_timeout;
    epoll_event event{EPOLLIN | EPOLLRDHUP, {.fd = fd}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
    waiting_.emplace(fd, std::move(c));
    ++open_;
  }
}

void Server::on_readable(Connection& c) {
  char buffer[kReadSize];
  const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0 || c.lingering) {
    if (n <= 0) close_in_loop(c.fd);
    return;
  }
  if (c.parser.bytes_seen() == 0 && c.pending.empty()) c.started = Clock::now();
  if (buffered_ + size_t(n) > buffer_budget_) {
    refuse(c, 503, "the server holds too many unfinished request bodies; try again later");
    return;
  }
  c.pending.append(buffer, size_t(n));
  c.counted += size_t(n);
  buffered_ += size_t(n);
  advance(c);
}

// Feeds the connection's pending bytes to its parser and acts on the parser's state.
bool Server::advance(Connection& c) {
  const size_t used = c.parser.feed(c.pending);
  c.pending.erase(0, used);
  switch (c.parser.state()) {
    case RequestParser::State::Failed:
      refuse(c, c.parser.error_status(), c.parser.error_message());
      return false;
    case RequestParser::State::Done:
      dispatch(c.fd);
      return false;
    case RequestParser::State::Body:
      if (!c.in_body) {
        c.in_body = true;
        c.deadline = Clock::now() + limits_.body_timeout;
      }
      if (c.parser.wants_continue() && !c.continue_sent) {
        send_now(c.fd, "HTTP/1.1 100 Continue\r\n\r\n");
        c.continue_sent = true;
      }
      return true;
    case RequestParser::State::Head: return true;
  }
  return true;
}

// A whole request: its connection leaves the loop for a worker.
void Server::dispatch(int fd) {
  auto it = waiting_.find(fd);
  std::unique_ptr<Connection> c = std::move(it->second);
  waiting_.erase(it);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  buffered_ -= c->counted;
  c->counted = c->pending.size();  // a pipelined request's bytes stay counted by the worker side
  Request request = std::move(c->parser.request());
  std::lock_guard lock(mutex_);
  jobs_.push_back(Job{std::move(c), std::move(request)});
  job_ready_.notify_one();
}

void Server::refuse(Connection& c, int status, const std::string& message) {
  const Response res = errors_(status, message);
  send_now(c.fd, response_head(res, (long long)res.body.size(), false, false) + res.body);
  if (after_) {
    const Request& req = c.parser.request();
    after_(Exchange{req.method, req.path, c.client, status, Clock::now() - c.started, ""});
  }
  ::shutdown(c.fd, SHUT_WR);
  c.lingering = true;
  c.deadline = Clock::now() + kLinger;
  buffered_ -= c.counted;
  c.counted = 0;
  c.pending.clear();
  c.pending.shrink_to_fit();
}

void Server::close_in_loop(int fd) {
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  buffered_ -= it->second->counted;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  waiting_.erase(it);
  --open_;
}

void Server::expire(Clock::time_point now) {
  std::vector<int> late;
  for (const auto& [fd, c] : waiting_)
    if (now >= c->deadline) late.push_back(fd);
  for (int fd : late) {
    Connection& c = *waiting_.at(fd);
    // A connection that sent nothing of a request was only idle: it closes without a word.
    if (c.lingering || (c.parser.bytes_seen() == 0 && c.pending.empty())) {
      close_in_loop(fd);
    } else {
      const auto limit = c.in_body ? limits_.body_timeout : limits_.head_timeout;
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g s", double(limit.count()) / 1000.0);
      refuse(c, 408, std::string("the request's ") + (c.in_body ? "body" : "head") + " did not arrive within " + seconds);
    }
  }
}

// Connections whose response was written come back to wait for their next request.
void Server::take_returned() {
  std::vector<std::unique_ptr<Connection>> back;
  {
    std::lock_guard lock(mutex_);
    back.swap(returned_);
  }
  for (auto& c : back) {
    const int fd = c->fd;
    if (stopping_) {
      ::close(fd);
      --open_;
      continue;
    }
    c->parser.reset();
    c->in_body = c->continue_sent = false;
    c->deadline = Clock::now() + limits_.head_timeout;
    buffered_ += c->counted;
    epoll_event event{EPOLLIN | EPOLLRDHUP, {.fd = fd}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
    Connection& ref = *c;
    waiting_.emplace(fd, std::move(c));
    if (!ref.pending.empty()) {  // a pipelined request already here
      ref.started = Clock::now();
      advance(ref);
    }
  }
}

// ---- the workers: handlers and responses ----

void Server::work() {
  while (true) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      job_ready_.wait(lock, [&] { return !jobs_.empty() || workers_quit_; });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++busy_workers_;
      busy_fds_.insert(job.connection->fd);
    }
    serve(job);
    std::lock_guard lock(mutex_);
    --busy_workers_;
    idle_.notify_all();
  }
}

void Server::serve(Job& job) {
  Response res;
  run_handler(job.request, res);
  const bool keep_alive = keep_alive_asked(job.request) && !stopping_;
  const bool written = write_response(*job.connection, job.request, res, keep_alive);
  if (after_)
    after_(Exchange{job.request.method, job.request.path, job.connection->client, res.status,
                    Clock::now() - job.connection->started, res.log_note ? res.log_note() : ""});
  finish(std::move(job.connection), written && keep_alive);
}

void Server::run_handler(const Request& req, Response& res) {
  try {
    if (before_ && before_(req, res)) return;
    const auto path = routes_.find(req.path);
    if (path == routes_.end()) {
      res = errors_(404, "no route " + req.path);
      return;
    }
    const auto method = path->second.find(req.method);
    if (method == path->second.end()) {
      std::string allowed;
      for (const auto& [name, handler] : path->second) allowed += (allowed.empty() ? "" : ", ") + name;
      res = errors_(405, "method " + req.method + " not allowed on " + req.path + " (allowed: " + allowed + ")");
      res.set_header("Allow", allowed);
      return;
    }
    method->second(req, res);
  } catch (const std::exception& e) {
    res = errors_(500, std::string("internal error: ") + e.what());
  } catch (...) {
    res = errors_(500, "internal error");
  }
}

bool Server::write_response(Connection& c, const Request& req, Response& res, bool keep_alive) {
  if (!res.stream) {
    const std::string head = response_head(res, (long long)res.body.size(), false, keep_alive);
    return send_all(c.fd, head, limits_.write_timeout, cutting_) && send_all(c.fd, res.body, limits_.write_timeout, cutting_);
  }
  // An HTTP/1.0 client gets the stream unframed, ended by the connection's close.
  const bool chunked = req.minor_version >= 1;
  SocketSink sink(c.fd, chunked, limits_.write_timeout, cutting_);
  bool complete = send_all(c.fd, response_head(res, -1, chunked, keep_alive && chunked), limits_.write_timeout, cutting_);
  if (complete) {
    try {
      while (!cutting_ && res.stream(sink)) {
      }
    } catch (...) {
      complete = false;
    }
    complete = complete && !cutting_ && sink.end();
  }
  if (res.stream_ended) res.stream_ended(complete);
  return complete && chunked;
}

void Server::finish(std::unique_ptr<Connection> c, bool keep_alive) {
  std::lock_guard lock(mutex_);
  busy_fds_.erase(c->fd);
  if (keep_alive && !stopping_) {
    returned_.push_back(std::move(c));
    wake();
    return;
  }
  ::close(c->fd);
  --open_;
}

}  // namespace petrel::http
