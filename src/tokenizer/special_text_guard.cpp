#include "tokenizer/special_text_guard.h"

#include <algorithm>
#include <optional>
#include <random>

#include "core/error.h"

namespace petrel {
namespace {

using nlohmann::ordered_json;

constexpr size_t kNonceDigits = 24;  // about 80 random bits: no client can guess them
constexpr size_t kIndexDigits = 8;   // a fixed width, so digits that follow cannot extend it
constexpr size_t kMaxPieces = 100000000;

std::string random_digits(size_t n) {
  std::random_device device;
  std::uniform_int_distribution<int> digit(0, 9);
  std::string digits;
  for (size_t i = 0; i < n; ++i) digits += char('0' + digit(device));
  return digits;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// The longest proper prefix of a special token that `text` ends with (0: none).
size_t special_start_at_end(std::string_view text, const std::vector<std::string>& specials) {
  size_t longest = 0;
  for (const std::string& special : specials)
    for (size_t n = std::min(special.size() - 1, text.size()); n > longest; --n)
      if (text.ends_with(std::string_view(special).substr(0, n))) longest = n;
  return longest;
}

// The longest proper suffix of a special token that `text` begins with (0: none).
size_t special_end_at_start(std::string_view text, const std::vector<std::string>& specials) {
  size_t longest = 0;
  for (const std::string& special : specials)
    for (size_t n = std::min(special.size() - 1, text.size()); n > longest; --n)
      if (text.starts_with(std::string_view(special).substr(special.size() - n))) longest = n;
  return longest;
}

// Sorted, with overlapping or touching ranges joined.
std::vector<ByteRange> merged(std::vector<ByteRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  std::vector<ByteRange> out;
  for (const ByteRange& r : ranges) {
    if (!out.empty() && r.begin <= out.back().end) out.back().end = std::max(out.back().end, r.end);
    else out.push_back(r);
  }
  return out;
}

std::optional<size_t> parse_index(std::string_view digits) {
  size_t index = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + size_t(c - '0');
  }
  return index;
}

}  // namespace

SpecialTextGuard::SpecialTextGuard(std::vector<std::string> specials)
    : specials_(std::move(specials)), nonce_(random_digits(kNonceDigits)) {
  std::erase_if(specials_, [](const std::string& s) { return s.empty(); });
}

std::vector<ByteRange> SpecialTextGuard::special_ranges(std::string_view s) const {
  std::vector<ByteRange> ranges;
  for (const std::string& special : specials_)
    for (size_t at = s.find(special); at != std::string_view::npos; at = s.find(special, at + 1))
      ranges.push_back({at, at + special.size()});
  size_t begin = 0, end = s.size();
  while (begin < end && is_space(s[begin])) ++begin;
  while (end > begin && is_space(s[end - 1])) --end;
  const std::string_view trimmed = s.substr(begin, end - begin);
  if (const size_t n = special_start_at_end(trimmed, specials_)) ranges.push_back({end - n, end});
  if (const size_t n = special_end_at_start(trimmed, specials_)) ranges.push_back({begin, begin + n});
  return merged(std::move(ranges));
}

std::string SpecialTextGuard::sentinel(size_t piece) const {
  const std::string index = std::to_string(piece);
  return nonce_ + std::string(kIndexDigits - index.size(), '0') + index;
}

std::string SpecialTextGuard::shield_string(const std::string& s) {
  const std::vector<ByteRange> ranges = special_ranges(s);
  if (ranges.empty()) return s;
  std::string out;
  size_t at = 0;
  for (const ByteRange& r : ranges) {
    check(pieces_.size() < kMaxPieces, "special-token text: more than " + std::to_string(kMaxPieces) + " pieces");
    out.append(s, at, r.begin - at);
    out += sentinel(pieces_.size());
    pieces_.push_back(s.substr(r.begin, r.end - r.begin));
    at = r.end;
  }
  return out.append(s, at);
}

void SpecialTextGuard::shield_keys(ordered_json& object) {
  bool any = false;
  for (const auto& item : object.items()) any = any || !special_ranges(item.key()).empty();
  if (!any) return;
  ordered_json rebuilt = ordered_json::object();
  for (auto& [key, value] : object.items()) rebuilt[shield_string(key)] = std::move(value);
  object = std::move(rebuilt);
}

// Iterative: the request's nesting is capped where it is parsed, but nothing here relies on it.
ordered_json SpecialTextGuard::shield(ordered_json value) {
  std::vector<ordered_json*> pending = {&value};
  while (!pending.empty()) {
    ordered_json& v = *pending.back();
    pending.pop_back();
    if (v.is_string()) v = shield_string(v.get_ref<const std::string&>());
    if (v.is_object()) shield_keys(v);
    if (v.is_structured())
      for (ordered_json& child : v) pending.push_back(&child);
  }
  return value;
}

GuardedText SpecialTextGuard::restore(std::string_view rendered) const {
  GuardedText out;
  size_t at = 0;
  for (size_t hit = rendered.find(nonce_); hit != std::string_view::npos; hit = rendered.find(nonce_, at)) {
    const size_t index_at = hit + nonce_.size();
    const auto piece = parse_index(rendered.substr(index_at, kIndexDigits));
    if (index_at + kIndexDigits > rendered.size() || !piece || *piece >= pieces_.size()) {
      out.text.append(rendered.substr(at, index_at - at));
      at = index_at;
      continue;
    }
    out.text.append(rendered.substr(at, hit - at));
    out.literal.push_back({out.text.size(), out.text.size() + pieces_[*piece].size()});
    out.text += pieces_[*piece];
    at = index_at + kIndexDigits;
  }
  out.text.append(rendered.substr(at));
  return out;
}

}  // namespace petrel
