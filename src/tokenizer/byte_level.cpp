#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace petrel::byte_level {
namespace {

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // indexed by code point; every mapped one is < 512

  Alphabet() {
    to_byte.fill(-1);
    char32_t next_unprintable = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : next_unprintable++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return alphabet().to_char[b]; }

std::optional<std::string> to_bytes(std::string_view token) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const char32_t cp = utf8::decode(token, pos);
    if (cp >= a.to_byte.size() || a.to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(a.to_byte[cp]);
  }
  return out;
}

std::string decoder_bytes(std::string_view token) {
  auto bytes = to_bytes(token);
  return bytes ? std::move(*bytes) : std::string(token);
}

}  // namespace petrel::byte_level
