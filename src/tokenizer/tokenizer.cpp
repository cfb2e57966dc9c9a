// Encoding and decoding with a loaded tokenizer.
#include <algorithm>
#include <deque>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace petrel {
namespace {

// Pre-tokenizes normalized text that holds no added token and merges each word.
void encode_plain(const Tokenizer::Impl& impl, std::string_view text, std::vector<uint32_t>& ids) {
  std::vector<std::string_view> words;
  std::deque<std::string> arena;
  impl.pre_tokenizer.split(text, words, arena);
  for (std::string_view w : words) impl.model.encode_word(w, ids);
}

// The parts of the (sorted) literal ranges inside [begin, end), moved to begin at 0.
std::vector<ByteRange> ranges_within(std::span<const ByteRange> literal, size_t begin, size_t end) {
  std::vector<ByteRange> out;
  auto it = std::upper_bound(literal.begin(), literal.end(), begin, [](size_t pos, const ByteRange& r) { return pos < r.end; });
  for (; it != literal.end() && it->begin < end; ++it)
    out.push_back({std::max(it->begin, begin) - begin, std::min(it->end, end) - begin});
  return out;
}

// `text` normalized piece by piece, cut at the edges of the literal ranges, so that the ranges can
// be found again in the result (`moved`). Used only where normalized added tokens must see them.
std::string normalize_pieces(const tokenizer::Normalizer& normalizer, std::string_view text,
                             std::span<const ByteRange> literal, std::vector<ByteRange>& moved) {
  std::string out;
  size_t at = 0;
  for (const ByteRange& r : literal) {
    out += normalizer.apply(text.substr(at, r.begin - at));
    const size_t begin = out.size();
    out += normalizer.apply(text.substr(r.begin, r.end - r.begin));
    moved.push_back({begin, out.size()});
    at = r.end;
  }
  return out + normalizer.apply(text.substr(at));
}

// Normalizes a stretch of raw text, then finds the normalized added tokens in it (special ones
// not over `literal`, ranges within the stretch).
void encode_unnormalized(const Tokenizer::Impl& impl, std::string_view text, std::span<const ByteRange> literal,
                         std::vector<uint32_t>& ids) {
  std::string storage;
  std::string_view normalized = text;
  std::vector<ByteRange> moved;
  const bool unchanged = impl.normalizer.trivially_unchanged(text);
  if (impl.normalized_added.empty() || literal.empty()) {
    if (!unchanged) normalized = storage = impl.normalizer.apply(text);
  } else if (unchanged) {
    moved.assign(literal.begin(), literal.end());
  } else {
    normalized = storage = normalize_pieces(impl.normalizer, text, literal, moved);
  }
  if (impl.normalized_added.empty()) return encode_plain(impl, normalized, ids);
  std::vector<tokenizer::Segment> segments;
  impl.normalized_added.split(normalized, segments, moved);
  for (const auto& s : segments) {
    if (s.id) ids.push_back(*s.id);
    else encode_plain(impl, normalized.substr(s.begin, s.end - s.begin), ids);
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const { return encode(text, {}); }

std::vector<uint32_t> Tokenizer::encode(std::string_view text, std::span<const ByteRange> literal) const {
  const size_t bad = utf8::first_invalid(text);
  if (bad != text.size())
    throw Error("tokenize: input is not valid UTF-8 (invalid byte sequence at byte offset " + std::to_string(bad) + ")");
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<tokenizer::Segment> segments;
  impl_->raw_added.split(text, segments, literal);
  for (const auto& s : segments) {
    if (s.id) ids.push_back(*s.id);
    else encode_unnormalized(*impl_, text.substr(s.begin, s.end - s.begin), ranges_within(literal, s.begin, s.end), ids);
  }
  return ids;
}

std::string_view Tokenizer::token_bytes(uint32_t id) const {
  if (id >= impl_->tokens.size() || !impl_->tokens[id].assigned)
    throw Error("token id " + std::to_string(id) + " is not in the vocabulary (ids run from 0 to " +
                std::to_string(impl_->tokens.size() - 1) + ")");
  return impl_->tokens[id].bytes;
}

bool Tokenizer::is_special(uint32_t id) const { return id < impl_->tokens.size() && impl_->tokens[id].special; }

std::vector<std::string> Tokenizer::special_token_texts() const {
  std::vector<std::pair<uint32_t, std::string>> specials;
  for (const auto& [content, id] : impl_->added_by_content)
    if (is_special(id)) specials.emplace_back(id, content);
  std::sort(specials.begin(), specials.end());
  std::vector<std::string> texts;
  for (auto& [id, content] : specials) texts.push_back(std::move(content));
  return texts;
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (uint32_t id : ids) {
    const std::string_view b = token_bytes(id);
    if (!(skip_special_tokens && is_special(id))) bytes.append(b);
  }
  return utf8::lossy(bytes);
}

uint32_t Tokenizer::vocab_size() const { return static_cast<uint32_t>(impl_->tokens.size()); }

std::optional<uint32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end()) return it->second;
  if (auto bytes = byte_level::to_bytes(token)) return impl_->model.id_of_bytes(*bytes);
  return std::nullopt;
}

void Tokenizer::clear_cache() const { impl_->model.clear_cache(); }

}  // namespace petrel
