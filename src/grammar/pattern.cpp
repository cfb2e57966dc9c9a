#include "grammar/pattern.h"

#include <cctype>
#include <optional>
#include <string>

#include "core/error.h"
#include "grammar/json_text.h"

namespace petrel::grammar {
namespace {

// Deeper groups are refused: parsing and building recurse once a level.
constexpr int kMaxGroupDepth = 64;

class Parser {
 public:
  Parser(std::string_view p, Spelling spelling) : p_(p), spelling_(spelling) {}

  Expr parse() {
    const bool start = eat('^');
    Expr body = alternation();
    const bool end = eat('$');
    if (at_ < p_.size()) fail("unexpected '" + std::string(1, p_[at_]) + "'");
    const Expr any = repeat(any_char(spelling_), 0, -1);
    return seq({start ? empty() : any, std::move(body), end ? empty() : any});
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("pattern: " + what + " at offset " + std::to_string(at_) + " of " + std::string(p_));
  }
  bool more() const { return at_ < p_.size(); }
  bool peek(char c) const { return more() && p_[at_] == c; }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++at_;
    return true;
  }
  // "$" ends the pattern only at its very end.
  bool at_end_anchor() const { return peek('$') && at_ + 1 == p_.size(); }

  Expr alternation() {
    std::vector<Expr> options{concatenation()};
    while (eat('|')) options.push_back(concatenation());
    return alt(std::move(options));
  }

  Expr concatenation() {
    std::vector<Expr> parts;
    while (more() && !peek('|') && !peek(')') && !at_end_anchor()) parts.push_back(quantified(atom()));
    return seq(std::move(parts));
  }

  int number() {
    size_t start = at_;
    int n = 0;
    while (more() && p_[at_] >= '0' && p_[at_] <= '9') {
      n = n * 10 + (p_[at_++] - '0');
      if (n > kMaxPatternCount) fail("a count above " + std::to_string(kMaxPatternCount));
    }
    if (at_ == start) fail("a count expected");
    return n;
  }

  Expr quantified(Expr e) {
    int min = 1, max = 1;
    if (eat('*')) min = 0, max = -1;
    else if (eat('+')) max = -1;
    else if (eat('?')) min = 0;
    else if (eat('{')) {
      min = max = number();
      if (eat(',')) max = peek('}') ? -1 : number();
      if (!eat('}')) fail("'}' expected");
      if (max >= 0 && max < min) fail("a count range {" + std::to_string(min) + "," + std::to_string(max) + "}");
    } else {
      return e;
    }
    eat('?');  // lazy: the same strings
    if (peek('*') || peek('+') || peek('{')) fail("a second quantifier");
    return repeat(std::move(e), min, max);
  }

  Expr atom() {
    const char c = p_[at_++];
    switch (c) {
      case '(': return group();
      case '[': return char_text(char_class(), spelling_);
      case '.': return char_text(subtract(all_chars(), {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}), spelling_);
      case '\\': return char_text(escape_set(), spelling_);
      case '^': case '$': fail("an anchor inside the pattern");
      case '*': case '+': case '?': case '{': fail("a quantifier with nothing before it");
      case ']': case '}': case ')': fail(std::string("an unmatched '") + c + "'");
    }
    --at_;
    const uint32_t cp = utf8_char();
    return char_text({{cp, cp}}, spelling_);
  }

  Expr group() {
    if (eat('?')) {
      if (!eat(':')) fail("lookaround and named groups are not supported");
    }
    if (++depth_ > kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth));
    Expr e = alternation();
    --depth_;
    if (!eat(')')) fail("')' expected");
    return e;
  }

  uint32_t utf8_char() {
    const auto b = uint8_t(p_[at_]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    if (at_ + size_t(len) > p_.size()) fail("invalid UTF-8");
    uint32_t cp = len == 1 ? b : b & (0x7Fu >> len);
    for (int i = 1; i < len; ++i) cp = cp << 6 | (uint8_t(p_[at_ + size_t(i)]) & 0x3F);
    at_ += size_t(len);
    return cp;
  }

  // \d \w \s and their negations, or nullopt for an escape of one character.
  std::optional<CodeRanges> class_escape(char c) const {
    const CodeRanges d = {{'0', '9'}}, w = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const CodeRanges s = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x2028, 0x2029}, {0xFEFF, 0xFEFF}};
    switch (c) {
      case 'd': return d;
      case 'w': return w;
      case 's': return s;
      case 'D': return subtract(all_chars(), d);
      case 'W': return subtract(all_chars(), w);
      case 'S': return subtract(all_chars(), s);
    }
    return std::nullopt;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i, ++at_) {
      if (!more() || !std::isxdigit(uint8_t(p_[at_]))) fail("hex digits expected");
      v = v * 16 + uint32_t(std::isdigit(uint8_t(p_[at_])) ? p_[at_] - '0' : (p_[at_] | 0x20) - 'a' + 10);
    }
    return v;
  }

  // The character a one-character escape stands for (after the backslash).
  uint32_t escaped_char() {
    if (!more()) fail("a pattern ending in a backslash");
    const char c = p_[at_++];
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'u': return hex(4);
      case 'x': return hex(2);
    }
    if (std::isalnum(uint8_t(c))) fail(std::string("the escape \\") + c + " is not supported");
    --at_;
    return utf8_char();
  }

  CodeRanges escape_set() {
    if (more())
      if (auto set = class_escape(p_[at_])) return ++at_, *set;
    const uint32_t cp = escaped_char();
    return {{cp, cp}};
  }

  // After '[': the class up to its ']'.
  CodeRanges char_class() {
    const bool negated = eat('^');
    CodeRanges set;
    while (!eat(']')) {
      if (!more()) fail("']' expected");
      CodeRanges item;
      uint32_t lo;
      if (eat('\\')) {
        item = escape_set();
        if (item.size() != 1 || item[0].first != item[0].second) {
          set.insert(set.end(), item.begin(), item.end());
          continue;
        }
        lo = item[0].first;
      } else {
        lo = utf8_char();
      }
      uint32_t hi = lo;
      if (peek('-') && at_ + 1 < p_.size() && p_[at_ + 1] != ']') {
        ++at_;
        hi = eat('\\') ? escaped_char() : utf8_char();
        if (hi < lo) fail("a class range out of order");
      }
      set.push_back({lo, hi});
    }
    return negated ? subtract(all_chars(), set) : set;
  }

  std::string_view p_;
  Spelling spelling_;
  size_t at_ = 0;
  int depth_ = 0;  // groups open
};

}  // namespace

Expr pattern_text(std::string_view pattern, Spelling spelling) { return Parser(pattern, spelling).parse(); }

}  // namespace petrel::grammar
