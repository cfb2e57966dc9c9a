#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace petrel::utf8 {
namespace {

// Length of the sequence a lead byte announces, or 0 when the byte cannot start one.
int sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Valid range of the second byte; the lead byte rules out overlongs, surrogates and > U+10FFFF.
bool second_byte_ok(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

struct Scan {
  size_t valid_bytes;  // bytes of the sequence that are valid so far
  bool complete;       // whether they form a whole code point
};

// Examines the sequence at `pos`: how many of its bytes are valid and whether it is whole.
Scan scan(std::string_view s, size_t pos) {
  const auto lead = static_cast<unsigned char>(s[pos]);
  const int len = sequence_length(lead);
  if (len == 0) return {0, false};
  if (len == 1) return {1, true};
  size_t k = 1;
  while (k < static_cast<size_t>(len) && pos + k < s.size()) {
    const auto b = static_cast<unsigned char>(s[pos + k]);
    const bool ok = k == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {k, false};
    ++k;
  }
  return {k, k == static_cast<size_t>(len)};
}

}  // namespace

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

char32_t decode(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  const int len = sequence_length(b0);
  if (len <= 1) {
    ++pos;
    return b0;
  }
  char32_t cp = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + k]) & 0x3F);
  pos += len;
  return cp;
}

size_t first_invalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Scan sc = scan(s, pos);
    if (!sc.complete) return pos;
    pos += sc.valid_bytes;
  }
  return pos;
}

size_t append_lossy(std::string_view bytes, std::string& out, bool final) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Scan sc = scan(bytes, pos);
    if (sc.complete) {
      out.append(bytes.substr(pos, sc.valid_bytes));
      pos += sc.valid_bytes;
      continue;
    }
    const bool truncated_at_end = sc.valid_bytes > 0 && pos + sc.valid_bytes == bytes.size();
    if (truncated_at_end && !final) break;
    append(out, kReplacement);
    pos += sc.valid_bytes > 0 ? sc.valid_bytes : 1;
  }
  return pos;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_python_space(char32_t cp) { return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace petrel::utf8
