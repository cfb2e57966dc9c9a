// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the template engine.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace petrel::utf8 {

constexpr char32_t kReplacement = 0xFFFD;

// Appends the UTF-8 encoding of `cp` to `out`.
void append(std::string& out, char32_t cp);

// Decodes the code point at `pos` of valid UTF-8 and moves `pos` past it.
char32_t decode(std::string_view s, size_t& pos);

// Byte offset of the first invalid or truncated sequence, or s.size() when all of `s` is valid.
size_t first_invalid(std::string_view s);

inline bool is_valid(std::string_view s) { return first_invalid(s) == s.size(); }

// Appends `bytes` to `out` as valid UTF-8, replacing each maximal invalid subpart with U+FFFD
// (the rule of Rust's String::from_utf8_lossy, which Hugging Face decoders use). When `final`
// is false, a truncated sequence at the very end is left unconsumed, because later bytes may
// complete it. Returns the number of bytes consumed.
size_t append_lossy(std::string_view bytes, std::string& out, bool final);

inline std::string lossy(std::string_view bytes) {
  std::string out;
  append_lossy(bytes, out, true);
  return out;
}

// Number of code points in valid UTF-8.
size_t length(std::string_view s);

// Unicode White_Space (what Rust's and Oniguruma's `\s` match).
bool is_white_space(char32_t cp);

// Python's str.isspace(): White_Space plus the information separators U+001C..U+001F.
bool is_python_space(char32_t cp);

// Rust regex `\w`: letters, marks, decimal and letter numbers, connector punctuation, ZWJ/ZWNJ.
bool is_word_char(char32_t cp);

}  // namespace petrel::utf8
