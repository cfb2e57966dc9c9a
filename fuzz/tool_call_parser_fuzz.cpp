// Model output through the tool-call parser, as a streamed answer delivers it. The input is a
// request's "tools" array (JSON; anything else means no schemas), a NUL byte, then the model's
// text. The text is pushed whole, byte by byte, and in pieces of 1..16 bytes; every way must find
// the same calls and, whitespace aside, the same content.
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "server/tool_calls.h"

namespace {

using petrel::fuzz::require;
using petrel::server::json;
using petrel::server::ToolCall;
using petrel::server::ToolCallParser;

struct Result {
  std::string content;  // whitespace removed: pieces decide which whitespace-only runs are dropped
  std::vector<ToolCall> calls;
};

void add(Result& r, ToolCallParser::Output out) {
  for (char c : out.content)
    if (!std::isspace(static_cast<unsigned char>(c))) r.content += c;
  for (ToolCall& call : out.calls) r.calls.push_back(std::move(call));
}

// Pushes `text` in pieces whose lengths `next_piece` gives.
template <class NextPiece>
Result parse(const json& tools, std::string_view text, NextPiece next_piece) {
  ToolCallParser parser(tools);
  Result r;
  while (!text.empty()) {
    const size_t n = std::min(text.size(), next_piece());
    add(r, parser.push(text.substr(0, n)));
    text.remove_prefix(n);
  }
  add(r, parser.finish());
  require(parser.calls_found() == int(r.calls.size()), "calls_found disagrees with the calls returned");
  return r;
}

bool same(const Result& a, const Result& b) {
  if (a.content != b.content || a.calls.size() != b.calls.size()) return false;
  for (size_t i = 0; i < a.calls.size(); ++i)
    if (a.calls[i].name != b.calls[i].name || a.calls[i].arguments != b.calls[i].arguments) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return -1;  // no text part
  json tools = json::parse(input.substr(0, nul), nullptr, /*allow_exceptions=*/false);
  if (!tools.is_array()) tools = nullptr;
  const std::string_view text = input.substr(nul + 1);

  const Result whole = parse(tools, text, [] { return SIZE_MAX; });
  const Result bytes = parse(tools, text, [] { return size_t(1); });
  uint32_t state = uint32_t(size) * 2654435761u + 1;  // xorshift: pieces vary with the input
  const Result pieces = parse(tools, text, [&state] {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return size_t(state % 16 + 1);
  });
  require(same(whole, bytes), "pushing byte by byte changes the result");
  require(same(whole, pieces), "pushing in pieces changes the result");
  return 0;
}
