// GPT-2's byte-level alphabet: every byte is shown as a printable code point in vocab files.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace petrel::byte_level {

// The printable code point that stands for byte `b`.
char32_t byte_to_char(uint8_t b);

// The raw bytes a vocab string stands for, or nullopt when some character is not in the alphabet.
std::optional<std::string> to_bytes(std::string_view token);

// Bytes of a token as Hugging Face's ByteLevel decoder produces them: the mapped bytes when every
// character is in the alphabet, otherwise the token's own UTF-8 (as for most added tokens).
std::string decoder_bytes(std::string_view token);

}  // namespace petrel::byte_level
