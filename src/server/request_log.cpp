#include "server/request_log.h"

#include <cstdio>
#include <ctime>

namespace petrel::server {
namespace {

constexpr size_t kLongestPath = 200;

// What a client sent, safe on one log line: control bytes become '?', a long path is cut.
std::string printable(const std::string& text) {
  if (text.empty()) return "-";
  std::string out = text.substr(0, kLongestPath);
  for (char& ch : out)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
  return text.size() > kLongestPath ? out + "..." : out;
}

// "2026-12-06T05:42:13.123Z" (UTC).
std::string utc_time(std::chrono::system_clock::time_point now) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = std::time_t(ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char date[32], millis[8];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(millis, sizeof millis, ".%03dZ", int(ms % 1000));
  return std::string(date) + millis;
}

}  // namespace

std::string request_log_line(const http::Exchange& e, std::chrono::system_clock::time_point now) {
  char duration[32];
  std::snprintf(duration, sizeof duration, "%.1f", std::chrono::duration<double, std::milli>(e.took).count());
  std::string line = utc_time(now) + " " + printable(e.method) + " " + printable(e.path) + " " + std::to_string(e.status);
  if (!e.note.empty()) line += " " + e.note;
  return line + " duration_ms=" + duration + " client=" + e.client;
}

std::string token_note(int prompt_tokens, int completion_tokens) {
  std::string note = "prompt_tokens=" + std::to_string(prompt_tokens);
  if (completion_tokens >= 0) note += " completion_tokens=" + std::to_string(completion_tokens);
  return note;
}

}  // namespace petrel::server
