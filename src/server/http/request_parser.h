// Reads one HTTP/1.1 request from bytes as they arrive, within limits: the head's size and header
// count, the body's size whether it comes with a Content-Length or chunked, and no compressed
// bodies (a small gzip body can expand without bound). Every refusal carries the status to answer
// and a message saying what was expected and what was found.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/http/message.h"

namespace petrel::http {

struct ParseLimits {
  size_t max_head_bytes = 64 << 10;  // request line and headers together
  size_t max_headers = 100;
  size_t max_body_bytes = 8 << 20;   // after chunked framing is removed
};

class RequestParser {
 public:
  enum class State { Head, Body, Done, Failed };

  explicit RequestParser(ParseLimits limits) : limits_(limits) {}

  // Consumes bytes; returns how many it used. Bytes after a finished request (a pipelined next
  // request) are not used: feed them again after reset().
  size_t feed(std::string_view data);

  State state() const { return state_; }
  // True once the head asked for "Expect: 100-continue" and the body has not begun.
  bool wants_continue() const { return state_ == State::Body && expects_continue_ && body_bytes_seen_ == 0; }
  // Bytes seen of the current request so far (head and body, framing included).
  size_t bytes_seen() const { return bytes_seen_; }

  Request& request() { return request_; }
  // When Failed: the status to answer (400, 413, 415, 431, 501, 505) and why.
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  // Ready for the next request on the same connection.
  void reset();

 private:
  enum class Chunk { Size, Data, DataEnd, Trailer };

  size_t feed_head(std::string_view data);
  size_t feed_body(std::string_view data);
  size_t feed_chunked(std::string_view data);
  bool parse_head();
  bool parse_request_line(std::string_view line);
  bool parse_header_line(std::string_view line);
  bool choose_framing();
  // Reads one line of chunked framing (size line or trailer) into line_; true when it is whole.
  bool take_framing_line(std::string_view data, size_t& used);
  bool chunk_size_line();
  void finish() { state_ = State::Done; }
  bool fail(int status, std::string message);

  ParseLimits limits_;
  State state_ = State::Head;
  Request request_;
  std::string head_;
  size_t bytes_seen_ = 0;
  bool chunked_ = false;
  bool expects_continue_ = false;
  uint64_t content_length_ = 0;
  uint64_t body_bytes_seen_ = 0;
  Chunk chunk_state_ = Chunk::Size;
  uint64_t chunk_left_ = 0;
  std::string line_;
  size_t trailer_lines_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace petrel::http
