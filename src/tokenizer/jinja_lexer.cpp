#include "tokenizer/jinja_lexer.h"

#include <charconv>

#include "tokenizer/jinja_error.h"
#include "tokenizer/utf8.h"

namespace petrel::jinja {
namespace {

// Jinja2 reads templates with universal newlines and drops one trailing newline.
std::string normalize_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_python_space_at(std::string_view s, size_t pos, size_t* next) {
  size_t p = pos;
  const char32_t cp = utf8::decode(s, p);
  if (next) *next = p;
  return utf8::is_python_space(cp);
}

std::string rstrip_space(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) --begin;
    if (!is_python_space_at(s, begin, nullptr)) break;
    end = begin;
  }
  return std::string(s.substr(0, end));
}

bool all_space(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size())
    if (!is_python_space_at(s, pos, &pos)) return false;
  return true;
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_text(src_.substr(pos_), false, 0);
        break;
      }
      const char kind = src_[tag + 1];
      // '+' only marks block and comment tags; in '{{+' it is a unary plus.
      const char next = tag + 2 < src_.size() ? src_[tag + 2] : 0;
      const char sign = next == '-' || (next == '+' && kind != '{') ? next : 0;
      emit_text(src_.substr(pos_, tag - pos_), kind != '{', sign);
      pos_ = tag + 2 + (sign ? 1 : 0);
      if (kind == '#') comment();
      else if (kind == '%' && raw_begins()) raw();
      else tag_tokens(kind);
    }
    tokens_.push_back({Tok::End, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    return std::string::npos;
  }

  // Text before a tag: '-' strips all whitespace before it; lstrip_blocks strips the spaces that
  // start the tag's line when nothing else precedes it on that line ('+' disables that).
  void emit_text(std::string_view text, bool is_block_or_comment, char sign) {
    const int line = line_;
    for (char c : text) line_ += c == '\n';
    std::string kept(text);
    if (sign == '-') {
      kept = rstrip_space(text);
    } else if (sign != '+' && is_block_or_comment) {
      const size_t line_begin = text.rfind('\n') == std::string_view::npos ? 0 : text.rfind('\n') + 1;
      if ((line_begin > 0 || line_starting_) && all_space(text.substr(line_begin))) kept = text.substr(0, line_begin);
    }
    if (!kept.empty()) tokens_.push_back({Tok::Text, std::move(kept), line});
    line_starting_ = false;
  }

  // After a tag: '-' eats all following whitespace, trim_blocks eats one newline after blocks.
  void after_tag(char end_sign, bool trim_newline) {
    const size_t start = pos_;
    if (end_sign == '-') {
      while (pos_ < src_.size() && is_python_space_at(src_, pos_, nullptr)) is_python_space_at(src_, pos_, &pos_);
    } else if (end_sign != '+' && trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    for (size_t i = start; i < pos_; ++i) line_ += src_[i] == '\n';
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  void comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail(line_, "unclosed comment: '{#' without '#}'");
    for (size_t i = pos_; i < end; ++i) line_ += src_[i] == '\n';
    const char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    pos_ = end + 2;
    after_tag(sign, true);
  }

  size_t skip_spaces(size_t p) const {
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n')) ++p;
    return p;
  }

  // Whether the block tag at pos_ is {% raw %} (or {%- raw -%} ...); consumes it if so.
  bool raw_begins() {
    size_t p = skip_spaces(pos_);
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && (is_name_start(src_[p + 3]) || is_digit(src_[p + 3]))))
      return false;
    p = skip_spaces(p + 3);
    char sign = 0;
    if (p < src_.size() && src_[p] == '-') sign = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    for (size_t i = pos_; i < p; ++i) line_ += src_[i] == '\n';
    pos_ = p + 2;
    after_tag(sign, false);
    return true;
  }

  void raw() {
    const int line = line_;
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 2)) {
      const char sign = p + 2 < src_.size() && (src_[p + 2] == '-' || src_[p + 2] == '+') ? src_[p + 2] : 0;
      size_t q = skip_spaces(p + 2 + (sign ? 1 : 0));
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q = skip_spaces(q + 6);
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      emit_text(src_.substr(pos_, p - pos_), true, sign);
      for (size_t i = p; i < q; ++i) line_ += src_[i] == '\n';
      pos_ = q + 2;
      after_tag(end_sign, true);
      return;
    }
    fail(line, "'{% raw %}' without '{% endraw %}'");
  }

  // The tokens of a {% %} or {{ }} tag, up to its closing delimiter.
  void tag_tokens(char kind) {
    const bool block = kind == '%';
    tokens_.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", line_});
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && (src_[pos_] == ' ' || src_[pos_] == '\t' || src_[pos_] == '\n' || src_[pos_] == '\r'))
        line_ += src_[pos_++] == '\n';
      if (pos_ >= src_.size()) fail(line_, block ? "unclosed '{%' tag" : "unclosed '{{' tag");
      const char* close = block ? "%}" : "}}";
      char end_sign = 0;
      size_t close_at = std::string::npos;
      if ((src_[pos_] == '-' || (block && src_[pos_] == '+')) && src_.compare(pos_ + 1, 2, close) == 0) {
        end_sign = src_[pos_];
        close_at = pos_ + 1;
      } else if (src_.compare(pos_, 2, close) == 0) {
        close_at = pos_;
      }
      if (close_at != std::string::npos && depth == 0) {
        tokens_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", line_});
        pos_ = close_at + 2;
        after_tag(end_sign, block);
        return;
      }
      depth += one_token();
    }
  }

  // Lexes one token at pos_; returns the change in bracket depth.
  int one_token() {
    const char c = src_[pos_];
    if (c == '\'' || c == '"') return string_literal(), 0;
    if (is_digit(c)) return number(), 0;
    if (is_name_start(c)) {
      const size_t begin = pos_;
      while (pos_ < src_.size() && (is_name_start(src_[pos_]) || is_digit(src_[pos_]))) ++pos_;
      tokens_.push_back({Tok::Name, src_.substr(begin, pos_ - begin), line_});
      return 0;
    }
    for (const char* op : {"**", "//", "==", "!=", "<=", ">="}) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({Tok::Op, op, line_});
        pos_ += 2;
        return 0;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos)
      fail(line_, std::string("unexpected character '") + c + "' in tag");
    tokens_.push_back({Tok::Op, std::string(1, c), line_});
    ++pos_;
    return (c == '(' || c == '[' || c == '{') ? 1 : (c == ')' || c == ']' || c == '}') ? -1 : 0;
  }

  void number() {
    const size_t begin = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() && is_digit(src_[pos_ + 1]))))
        ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && is_digit(src_[p])) {
        pos_ = p;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = begin; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    Token t{is_float ? Tok::Float : Tok::Int, text, line_};
    if (is_float) t.number = std::stod(text);
    else if (std::from_chars(text.data(), text.data() + text.size(), t.integer).ec != std::errc())
      fail(line_, "integer literal " + text + " does not fit in 64 bits");
    tokens_.push_back(std::move(t));
  }

  // A quoted literal with Python's backslash escapes.
  void string_literal() {
    const char quote = src_[pos_];
    const int line = line_;
    std::string out;
    ++pos_;
    while (true) {
      if (pos_ >= src_.size()) fail(line, "unterminated string literal");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) fail(line, "unterminated string literal");
      escape(out);
    }
    tokens_.push_back({Tok::String, std::move(out), line});
  }

  void escape(std::string& out) {
    const char e = src_[pos_++];
    auto hex = [&](int count) {
      if (pos_ + count > src_.size()) fail(line_, "truncated \\x/\\u escape in string literal");
      uint32_t cp = 0;
      const auto r = std::from_chars(src_.data() + pos_, src_.data() + pos_ + count, cp, 16);
      if (r.ptr != src_.data() + pos_ + count) fail(line_, "malformed \\x/\\u escape in string literal");
      pos_ += count;
      utf8::append(out, cp);
    };
    switch (e) {
      case '\n': ++line_; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = e - '0';
          for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k)
            cp = cp * 8 + (src_[pos_++] - '0');
          utf8::append(out, cp);
        } else {
          out += '\\';  // Python keeps unknown escapes as written
          out += e;
        }
    }
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace petrel::jinja
