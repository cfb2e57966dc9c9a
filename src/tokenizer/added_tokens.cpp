#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace petrel::tokenizer {
namespace {

// The code point that ends text[0, end), which must be valid UTF-8.
char32_t last_char(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
  return utf8::decode(text, begin);
}

bool word_before(std::string_view text, size_t pos) { return pos > 0 && utf8::is_word_char(last_char(text, pos)); }

bool word_after(std::string_view text, size_t pos) {
  return pos < text.size() && utf8::is_word_char(utf8::decode(text, pos));
}

// Start of the whitespace run that ends at `pos`.
size_t skip_space_backward(std::string_view text, size_t pos) {
  while (pos > 0) {
    size_t begin = pos - 1;
    while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
    size_t probe = begin;
    if (!utf8::is_white_space(utf8::decode(text, probe))) break;
    pos = begin;
  }
  return pos;
}

// End of the whitespace run that starts at `pos`.
size_t skip_space_forward(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    size_t next = pos;
    if (!utf8::is_white_space(utf8::decode(text, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)) {
  for (size_t i = 0; i < patterns_.size(); ++i)
    if (!patterns_[i].empty()) by_first_byte_[static_cast<unsigned char>(patterns_[i][0])].push_back(i);
  for (auto& bucket : by_first_byte_)
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t a, size_t b) { return patterns_[a].size() > patterns_[b].size(); });
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::next_match(std::string_view text, size_t from) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    for (size_t i : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& p = patterns_[i];
      if (text.compare(pos, p.size(), p) == 0) return Match{pos, pos + p.size(), i};
    }
  }
  return std::nullopt;
}

std::optional<size_t> AddedTokenMatcher::skip_literal(const Match& m, std::span<const ByteRange> literal) const {
  if (!tokens_[m.token].special) return std::nullopt;
  // The first range that ends after the match begins.
  const auto it = std::upper_bound(literal.begin(), literal.end(), m.begin,
                                   [](size_t pos, const ByteRange& r) { return pos < r.end; });
  if (it == literal.end() || it->begin >= m.end) return std::nullopt;
  return it->begin <= m.begin ? m.end : m.begin + 1;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out, std::span<const ByteRange> literal) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t scan = 0;     // where the automaton resumes: the raw end of the last match found
  while (auto m = next_match(text, scan)) {
    if (auto resume = skip_literal(*m, literal)) {
      scan = *resume;
      continue;
    }
    scan = m->end;
    const AddedToken& token = tokens_[m->token];
    if (token.single_word && (word_before(text, m->begin) || word_after(text, m->end))) continue;
    size_t begin = m->begin, end = m->end;
    if (token.lstrip) begin = std::max(skip_space_backward(text, begin), emitted);
    if (token.rstrip) end = skip_space_forward(text, end);
    if (begin > emitted) out.push_back({emitted, begin, std::nullopt});
    out.push_back({begin, end, token.id});
    emitted = end;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), std::nullopt});
}

}  // namespace petrel::tokenizer
