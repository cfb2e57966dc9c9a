#include "server/http/request_parser.h"

#include <algorithm>
#include <cctype>

namespace petrel::http {
namespace {

constexpr size_t kMaxFramingLine = 4096;  // a chunk-size line or a trailer

bool is_token_char(unsigned char c) {
  return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(char(c)) != std::string_view::npos;
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_token_char(uint8_t(c)); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(uint8_t(c)));
  return out;
}

// Shows a client's text in a message: at most 64 bytes, control bytes as '?'.
std::string shown(std::string_view s) {
  std::string out(s.substr(0, 64));
  for (char& c : out)
    if (uint8_t(c) < 0x20 || uint8_t(c) == 0x7f) c = '?';
  return "\"" + out + (s.size() > 64 ? "...\"" : "\"");
}

bool parse_decimal(std::string_view s, uint64_t& value) {
  if (s.empty() || s.size() > 19) return false;
  value = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + uint64_t(c - '0');
  }
  return true;
}

}  // namespace

size_t RequestParser::feed(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && (state_ == State::Head || state_ == State::Body)) {
    const size_t n = state_ == State::Head ? feed_head(data.substr(used)) : feed_body(data.substr(used));
    used += n;
    bytes_seen_ += n;
  }
  return used;
}

void RequestParser::reset() {
  state_ = State::Head;
  request_ = Request();
  head_.clear();
  bytes_seen_ = 0;
  chunked_ = expects_continue_ = false;
  content_length_ = body_bytes_seen_ = 0;
  chunk_state_ = Chunk::Size;
  chunk_left_ = 0;
  line_.clear();
  trailer_lines_ = 0;
  error_status_ = 0;
  error_message_.clear();
}

bool RequestParser::fail(int status, std::string message) {
  state_ = State::Failed;
  error_status_ = status;
  error_message_ = std::move(message);
  return false;
}

// Collects the head up to its empty line (CRLF or bare LF line ends), then parses it.
size_t RequestParser::feed_head(std::string_view data) {
  size_t skipped = 0;
  // Empty lines before a request line are allowed (some clients send CRLF after a body).
  while (head_.empty() && skipped < data.size() && (data[skipped] == '\r' || data[skipped] == '\n')) ++skipped;
  data.remove_prefix(skipped);
  const size_t before = head_.size();
  head_.append(data);
  size_t end = 0;
  for (size_t i = before > 2 ? before - 2 : 0; i < head_.size() && end == 0; ++i) {
    if (head_[i] != '\n') continue;
    if (i + 1 < head_.size() && head_[i + 1] == '\n') end = i + 2;
    else if (i + 2 < head_.size() && head_[i + 1] == '\r' && head_[i + 2] == '\n') end = i + 3;
  }
  const size_t head_bytes = end ? end : head_.size();
  if (head_bytes > limits_.max_head_bytes)
    fail(431, "the request line and headers exceed " + std::to_string(limits_.max_head_bytes) + " bytes");
  if (end == 0 || state_ == State::Failed) return skipped + data.size();
  head_.resize(end);
  parse_head();
  return skipped + (end - before);
}

bool RequestParser::parse_head() {
  std::string_view rest(head_);
  bool first = true;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;  // the head's end
    if (line.find('\r') != std::string_view::npos) return fail(400, "a header line holds a bare carriage return");
    if (first ? !parse_request_line(line) : !parse_header_line(line)) return false;
    first = false;
  }
  return choose_framing();
}

bool RequestParser::parse_request_line(std::string_view line) {
  const size_t a = line.find(' ');
  const size_t b = a == std::string_view::npos ? a : line.find(' ', a + 1);
  if (b == std::string_view::npos || line.find(' ', b + 1) != std::string_view::npos)
    return fail(400, "expected a request line \"METHOD /path HTTP/1.1\", found " + shown(line));
  const std::string_view method = line.substr(0, a), target = line.substr(a + 1, b - a - 1), version = line.substr(b + 1);
  if (!is_token(method)) return fail(400, "expected a method name, found " + shown(method));
  if (target.empty() || target.front() != '/' ||
      std::any_of(target.begin(), target.end(), [](char c) { return uint8_t(c) <= 0x20 || uint8_t(c) == 0x7f; }))
    return fail(400, "expected a target path starting with '/', found " + shown(target));
  if (version == "HTTP/1.1") request_.minor_version = 1;
  else if (version == "HTTP/1.0") request_.minor_version = 0;
  else if (version.substr(0, 5) == "HTTP/") return fail(505, "only HTTP/1.0 and HTTP/1.1 are served, found " + shown(version));
  else return fail(400, "expected HTTP/1.1 at the request line's end, found " + shown(version));
  request_.method = std::string(method);
  const size_t q = target.find('?');
  request_.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) request_.query = std::string(target.substr(q + 1));
  return true;
}

bool RequestParser::parse_header_line(std::string_view line) {
  if (line.front() == ' ' || line.front() == '\t') return fail(400, "folded header lines are not accepted");
  const size_t colon = line.find(':');
  const std::string_view name = line.substr(0, colon);
  if (colon == std::string_view::npos || !is_token(name))
    return fail(400, "expected a header \"Name: value\", found " + shown(line));
  const std::string_view value = trim(line.substr(colon + 1));
  if (std::any_of(value.begin(), value.end(), [](char c) { return (uint8_t(c) < 0x20 && c != '\t') || uint8_t(c) == 0x7f; }))
    return fail(400, "the header " + std::string(name) + " holds a control character");
  if (request_.headers.size() == limits_.max_headers)
    return fail(431, "a request may have at most " + std::to_string(limits_.max_headers) + " headers");
  request_.headers.emplace_back(lower(name), std::string(value));
  return true;
}

// Content-Length or chunked, never both (a request smuggled past a proxy); no compressed bodies.
bool RequestParser::choose_framing() {
  std::string length_text;
  int transfer_encodings = 0;
  for (const auto& [name, value] : request_.headers) {
    if (name == "content-encoding") {
      for (size_t start = 0; start <= value.size();) {
        const size_t comma = std::min(value.find(',', start), value.size());
        const std::string coding = lower(trim(std::string_view(value).substr(start, comma - start)));
        if (!coding.empty() && coding != "identity")
          return fail(415, "Content-Encoding " + shown(coding) +
                               ": compressed request bodies are not accepted; send the body uncompressed");
        start = comma + 1;
      }
    } else if (name == "transfer-encoding") {
      ++transfer_encodings;
      if (lower(value) != "chunked")
        return fail(501, "Transfer-Encoding " + shown(value) + " is not supported; only chunked is");
    } else if (name == "content-length") {
      if (!length_text.empty() && length_text != value)
        return fail(400, "two different Content-Length headers: " + shown(length_text) + " and " + shown(value));
      length_text = value;
    } else if (name == "expect") {
      if (lower(value) != "100-continue") return fail(417, "Expect " + shown(value) + " is not supported; only 100-continue is");
      expects_continue_ = true;
    }
  }
  if (transfer_encodings > 1) return fail(400, "more than one Transfer-Encoding header");
  if (transfer_encodings && !length_text.empty()) return fail(400, "both Transfer-Encoding and Content-Length were sent");
  chunked_ = transfer_encodings == 1;
  if (!length_text.empty()) {
    if (!parse_decimal(length_text, content_length_))
      return fail(400, "expected Content-Length to be a byte count, found " + shown(length_text));
    if (content_length_ > limits_.max_body_bytes)
      return fail(413, "the request body is " + std::to_string(content_length_) + " bytes; the limit is " +
                           std::to_string(limits_.max_body_bytes));
  }
  if (!chunked_ && content_length_ == 0) {
    finish();
    return true;
  }
  state_ = State::Body;
  return true;
}

size_t RequestParser::feed_body(std::string_view data) {
  if (chunked_) return feed_chunked(data);
  const size_t n = size_t(std::min<uint64_t>(data.size(), content_length_ - body_bytes_seen_));
  request_.body.append(data.substr(0, n));
  body_bytes_seen_ += n;
  if (body_bytes_seen_ == content_length_) finish();
  return n;
}

size_t RequestParser::feed_chunked(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && state_ == State::Body) {
    if (chunk_state_ == Chunk::Data) {
      const size_t n = size_t(std::min<uint64_t>(data.size() - used, chunk_left_));
      request_.body.append(data.substr(used, n));
      used += n;
      chunk_left_ -= n;
      body_bytes_seen_ += n;
      if (chunk_left_ == 0) chunk_state_ = Chunk::DataEnd;
      continue;
    }
    if (!take_framing_line(data, used)) continue;
    if (chunk_state_ == Chunk::Size) {
      chunk_size_line();
    } else if (chunk_state_ == Chunk::DataEnd) {
      if (!line_.empty()) fail(400, "expected a line end after a chunk's data, found " + shown(line_));
      chunk_state_ = Chunk::Size;
    } else if (line_.empty()) {
      finish();
    } else if (++trailer_lines_ > limits_.max_headers) {
      fail(431, "a request may have at most " + std::to_string(limits_.max_headers) + " trailer lines");
    }
    line_.clear();
  }
  return used;
}

bool RequestParser::take_framing_line(std::string_view data, size_t& used) {
  const size_t nl = data.find('\n', used);
  const size_t end = nl == std::string_view::npos ? data.size() : nl;
  line_.append(data.substr(used, end - used));
  used = nl == std::string_view::npos ? data.size() : nl + 1;
  if (line_.size() > kMaxFramingLine)
    return fail(400, "a chunk-size or trailer line is longer than " + std::to_string(kMaxFramingLine) + " bytes");
  if (nl == std::string_view::npos) return false;
  if (!line_.empty() && line_.back() == '\r') line_.pop_back();
  return true;
}

bool RequestParser::chunk_size_line() {
  const std::string_view size = trim(std::string_view(line_).substr(0, line_.find(';')));
  uint64_t value = 0;
  if (size.empty() || size.size() > 15 || !std::all_of(size.begin(), size.end(), [](char c) { return std::isxdigit(uint8_t(c)); }))
    return fail(400, "expected a chunk size in hexadecimal, found " + shown(line_));
  for (char c : size) value = value * 16 + uint64_t(std::isdigit(uint8_t(c)) ? c - '0' : std::tolower(uint8_t(c)) - 'a' + 10);
  if (body_bytes_seen_ + value > limits_.max_body_bytes)
    return fail(413, "the chunked request body exceeds the limit of " + std::to_string(limits_.max_body_bytes) + " bytes");
  chunk_left_ = value;
  chunk_state_ = value == 0 ? Chunk::Trailer : Chunk::Data;
  return true;
}

}  // namespace petrel::http
