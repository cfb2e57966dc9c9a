#include "tokenizer/jinja_pystr.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "tokenizer/utf8.h"

namespace petrel::jinja::pystr {
namespace {

std::u32string decode_all(std::string_view s) {
  std::u32string out;
  size_t pos = 0;
  while (pos < s.size()) out += utf8::decode(s, pos);
  return out;
}

std::string encode_all(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) utf8::append(out, c);
  return out;
}

utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool is_cased(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool is_alpha(char32_t c) { return category(c) >= UTF8PROC_CATEGORY_LU && category(c) <= UTF8PROC_CATEGORY_LO; }
bool is_digit(char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }
bool is_numeric(char32_t c) { return category(c) >= UTF8PROC_CATEGORY_ND && category(c) <= UTF8PROC_CATEGORY_NO; }
char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

// Python's full case mappings where one character becomes several (Unicode SpecialCasing.txt,
// the unconditional entries that matter in practice); utf8proc maps one character to one.
struct SpecialCase {
  char32_t c;
  const char32_t* lower;
  const char32_t* title;
  const char32_t* upper;
};
constexpr SpecialCase kSpecialCases[] = {
    {0x00DF, U"\u00DF", U"Ss", U"SS"},            {0x0130, U"i\u0307", U"\u0130", U"\u0130"},
    {0xFB00, U"\uFB00", U"Ff", U"FF"},            {0xFB01, U"\uFB01", U"Fi", U"FI"},
    {0xFB02, U"\uFB02", U"Fl", U"FL"},            {0xFB03, U"\uFB03", U"Ffi", U"FFI"},
    {0xFB04, U"\uFB04", U"Ffl", U"FFL"},          {0xFB05, U"\uFB05", U"St", U"ST"},
    {0xFB06, U"\uFB06", U"St", U"ST"},            {0x0149, U"\u0149", U"\u02BCN", U"\u02BCN"},
    {0x01F0, U"\u01F0", U"J\u030C", U"J\u030C"}, {0x0587, U"\u0587", U"\u0535\u0582", U"\u0535\u0552"},
};

enum class Case { Lower, Title, Upper };

void append_case(std::u32string& out, char32_t c, Case which) {
  for (const auto& sc : kSpecialCases) {
    if (sc.c != c) continue;
    out += which == Case::Lower ? sc.lower : which == Case::Title ? sc.title : sc.upper;
    return;
  }
  out += which == Case::Lower ? to_lower(c) : which == Case::Title ? to_title(c) : to_upper(c);
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

}  // namespace

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string text = decode_all(s);
  const std::u32string set = chars ? decode_all(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : utf8::is_python_space(c); };
  size_t b = 0, e = text.size();
  if (left)
    while (b < e && strippable(text[b])) ++b;
  if (right)
    while (e > b && strippable(text[e - 1])) --e;
  return encode_all(std::u32string_view(text).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, long maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) throw std::runtime_error("ValueError: empty separator");
    if (!from_right) {
      size_t begin = 0;
      for (size_t at = s.find(*sep); at != std::string_view::npos && (maxsplit < 0 || long(parts.size()) < maxsplit);
           at = s.find(*sep, begin)) {
        parts.emplace_back(s.substr(begin, at - begin));
        begin = at + sep->size();
      }
      parts.emplace_back(s.substr(begin));
      return parts;
    }
    size_t end = s.size();
    while (maxsplit < 0 || long(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      parts.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // Whitespace splitting drops empty strings; the unsplit remainder keeps its inner spacing.
  const std::u32string text = decode_all(s);
  std::vector<std::u32string> words;
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < text.size() && utf8::is_python_space(text[i])) ++i;
      if (i >= text.size()) break;
      if (maxsplit >= 0 && long(words.size()) == maxsplit) {
        size_t e = text.size();
        while (e > i && utf8::is_python_space(text[e - 1])) --e;
        words.push_back(text.substr(i, e - i));
        break;
      }
      size_t j = i;
      while (j < text.size() && !utf8::is_python_space(text[j])) ++j;
      words.push_back(text.substr(i, j - i));
      i = j;
    }
  } else {
    long i = static_cast<long>(text.size());
    while (true) {
      while (i > 0 && utf8::is_python_space(text[i - 1])) --i;
      if (i <= 0) break;
      if (maxsplit >= 0 && long(words.size()) == maxsplit) {
        long b = 0;
        while (b < i && utf8::is_python_space(text[b])) ++b;
        words.push_back(text.substr(b, i - b));
        break;
      }
      long j = i;
      while (j > 0 && !utf8::is_python_space(text[j - 1])) --j;
      words.push_back(text.substr(j, i - j));
      i = j;
    }
    std::reverse(words.begin(), words.end());
  }
  for (const auto& w : words) parts.push_back(encode_all(w));
  return parts;
}

std::vector<std::string> splitlines(std::string_view s) {
  const std::u32string text = decode_all(s);
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!is_line_break(text[i])) continue;
    lines.push_back(encode_all(std::u32string_view(text).substr(begin, i - begin)));
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
    begin = i + 1;
  }
  if (begin < text.size()) lines.push_back(encode_all(std::u32string_view(text).substr(begin)));
  return lines;
}

std::string lower(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode_all(s)) append_case(out, c, Case::Lower);
  return encode_all(out);
}

std::string upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode_all(s)) append_case(out, c, Case::Upper);
  return encode_all(out);
}

std::string title(std::string_view s) {
  std::u32string out;
  bool previous_cased = false;
  for (char32_t c : decode_all(s)) {
    const bool cased = is_cased(c);
    if (cased) append_case(out, c, previous_cased ? Case::Lower : Case::Title);
    else out += c;
    previous_cased = cased;
  }
  return encode_all(out);
}

std::string capitalize(std::string_view s) {
  std::u32string out;
  const std::u32string t = decode_all(s);
  for (size_t i = 0; i < t.size(); ++i) append_case(out, t[i], i == 0 ? Case::Title : Case::Lower);
  return encode_all(out);
}

std::string replace(std::string_view s, std::string_view old, std::string_view replacement, long count) {
  std::string out;
  if (old.empty()) {  // Python inserts the replacement between all characters
    size_t pos = 0;
    long done = 0;
    while (true) {
      if (count < 0 || done < count) {
        out.append(replacement);
        ++done;
      }
      if (pos >= s.size()) break;
      const size_t begin = pos;
      utf8::decode(s, pos);
      out.append(s.substr(begin, pos - begin));
    }
    return out;
  }
  size_t begin = 0;
  long done = 0;
  for (size_t at = s.find(old); at != std::string_view::npos && (count < 0 || done < count); at = s.find(old, begin)) {
    out.append(s.substr(begin, at - begin));
    out.append(replacement);
    begin = at + old.size();
    ++done;
  }
  out.append(s.substr(begin));
  return out;
}

long count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<long>(utf8::length(s)) + 1;
  long n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

long find(std::string_view s, std::string_view sub) {
  const size_t at = s.find(sub);
  return at == std::string_view::npos ? -1 : static_cast<long>(utf8::length(s.substr(0, at)));
}

std::string reverse(std::string_view s) {
  std::u32string t = decode_all(s);
  std::reverse(t.begin(), t.end());
  return encode_all(t);
}

std::vector<long> slice_indices(long length, std::optional<long> start, std::optional<long> stop, long step) {
  if (step == 0) throw std::runtime_error("ValueError: slice step cannot be zero");
  auto clamp = [&](std::optional<long> v, long dflt, long lo, long hi) {
    if (!v) return dflt;
    long x = *v < 0 ? *v + length : *v;
    return std::clamp(x, lo, hi);
  };
  std::vector<long> out;
  if (step > 0) {
    const long b = clamp(start, 0, 0, length), e = clamp(stop, length, 0, length);
    for (long i = b; i < e; i += step) out.push_back(i);
  } else {
    const long b = clamp(start, length - 1, -1, length - 1), e = clamp(stop, -1, -1, length - 1);
    for (long i = b; i > e; i += step) out.push_back(i);
  }
  return out;
}

std::string slice(std::string_view s, std::optional<long> start, std::optional<long> stop, long step) {
  const std::u32string t = decode_all(s);
  std::u32string out;
  for (long i : slice_indices(static_cast<long>(t.size()), start, stop, step)) out += t[i];
  return encode_all(out);
}

bool all_of(std::string_view s, const char* predicate) {
  const std::u32string t = decode_all(s);
  if (t.empty()) return false;
  for (char32_t c : t) {
    bool ok = false;
    if (std::strcmp(predicate, "alpha") == 0) ok = is_alpha(c);
    else if (std::strcmp(predicate, "digit") == 0) ok = is_digit(c);
    else if (std::strcmp(predicate, "space") == 0) ok = utf8::is_python_space(c);
    else if (std::strcmp(predicate, "alnum") == 0) ok = is_alpha(c) || is_numeric(c);
    if (!ok) return false;
  }
  return true;
}

bool is_lower(std::string_view s) {
  bool any_cased = false;
  for (char32_t c : decode_all(s)) {
    if (category(c) == UTF8PROC_CATEGORY_LU || category(c) == UTF8PROC_CATEGORY_LT) return false;
    any_cased |= category(c) == UTF8PROC_CATEGORY_LL;
  }
  return any_cased;
}

bool is_upper(std::string_view s) {
  bool any_cased = false;
  for (char32_t c : decode_all(s)) {
    if (category(c) == UTF8PROC_CATEGORY_LL || category(c) == UTF8PROC_CATEGORY_LT) return false;
    any_cased |= category(c) == UTF8PROC_CATEGORY_LU;
  }
  return any_cased;
}

}  // namespace petrel::jinja::pystr
