// Raw bytes from a connection through the HTTP request parser, with small limits so that every
// refusal is reachable. The bytes are fed whole, byte by byte, and in pieces of 1..64 bytes, and
// each request that completes is followed by the rest (pipelining); every way must read the same
// requests and end in the same state with the same refusal.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "server/http/request_parser.h"

namespace {

using petrel::fuzz::require;
using petrel::http::ParseLimits;
using petrel::http::RequestParser;

// What a connection's bytes came to: each whole request as text, then the last state and status.
std::string read_all(std::string_view bytes, size_t (*piece)(size_t&), size_t seed) {
  ParseLimits limits;
  limits.max_head_bytes = 512;
  limits.max_headers = 8;
  limits.max_body_bytes = 1024;
  RequestParser parser(limits);
  std::string out;
  while (true) {
    const size_t n = std::min(bytes.size(), piece(seed));
    const size_t used = parser.feed(bytes.substr(0, n));
    require(used <= n, "the parser used more bytes than it was given");
    require(parser.state() == RequestParser::State::Done || parser.state() == RequestParser::State::Failed ||
                used == n,
            "the parser left bytes unused before its request was whole");
    bytes.remove_prefix(used);
    if (parser.state() == RequestParser::State::Done) {
      const auto& r = parser.request();
      require(r.body.size() <= limits.max_body_bytes, "a body over the limit was accepted");
      require(r.headers.size() <= limits.max_headers, "more headers than the limit were accepted");
      out += r.method + " " + r.path + "?" + r.query + " 1." + std::to_string(r.minor_version) + "\n";
      for (const auto& [name, value] : r.headers) out += name + ": " + value + "\n";
      out += std::to_string(r.body.size()) + ":" + r.body + "\n";
      parser.reset();
      continue;
    }
    if (parser.state() == RequestParser::State::Failed) {
      require(parser.error_status() >= 400 && parser.error_status() < 600 && !parser.error_message().empty(),
              "a refusal without a 4xx/5xx status and a message");
      return out + "refused " + std::to_string(parser.error_status()) + ": " + parser.error_message();
    }
    if (bytes.empty()) return out + "waiting in state " + std::to_string(int(parser.state()));
  }
}

size_t whole(size_t&) { return SIZE_MAX; }
size_t one(size_t&) { return 1; }
size_t varied(size_t& seed) {
  seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  return 1 + (seed >> 58);  // 1..64
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string at_once = read_all(bytes, whole, 0);
  require(read_all(bytes, one, 0) == at_once, "byte by byte differs from whole:\n" + at_once);
  require(read_all(bytes, varied, size) == at_once, "pieces differ from whole:\n" + at_once);
  return 0;
}
