// An HTTP/1.1 request as the server hands it to a handler, and the response the handler fills:
// a whole body, or a stream written chunk by chunk (server-sent events).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace petrel::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target up to '?', as sent (no decoding: routes are plain paths)
  std::string query;   // after '?', without it
  int minor_version = 1;  // HTTP/1.minor_version
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in arrival order
  std::string body;

  // The first header of that (lower-case) name, or null.
  const std::string* header(std::string_view name) const;
  // The header's value, or "" when absent.
  std::string header_or_empty(std::string_view name) const;
};

// What a streaming response writes to. Each write is one chunk on the wire; a write that fails
// (the client left, or stopped reading for the write timeout) returns false, and so do all later ones.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(std::string_view data) = 0;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // beyond Content-Type and the framing
  std::string body;

  // Set for a streamed body: called again and again until it returns false (finished, or the
  // sink failed); the headers go out before the first call.
  std::function<bool(StreamSink&)> stream;
  // Called once after a stream ends; `complete` is false when it broke off (write failure,
  // shutdown) before `stream` said it was finished.
  std::function<void(bool complete)> stream_ended;
  // Called once the response is written, for the request log: what the handler knows beyond the
  // status (e.g. "prompt_tokens=23 completion_tokens=21"); unset: nothing.
  std::function<std::string()> log_note;

  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
};

// The reason phrase of a status ("Not Found"), "Unknown" for codes this server never sends.
const char* reason_phrase(int status);

}  // namespace petrel::http
