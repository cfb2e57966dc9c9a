#include "generate/ngram_draft.h"

#include "core/error.h"
#include "generate/rng.h"

namespace petrel {

NgramDrafter::NgramDrafter(int min_ngram, int max_ngram) : min_n_(min_ngram), max_n_(max_ngram) {
  check(min_ngram >= 1 && max_ngram >= min_ngram,
        "n-gram sizes: expected 1 <= min <= max, found min " + std::to_string(min_ngram) + ", max " +
            std::to_string(max_ngram));
  latest_.resize(size_t(max_n_ - min_n_ + 1));
}

uint64_t NgramDrafter::hash(int end, int n) const {
  uint64_t h = uint64_t(n);
  for (int i = end - n + 1; i <= end; ++i) h = mix64(h ^ uint64_t(uint32_t(tokens_[size_t(i)])));
  return h;
}

bool NgramDrafter::same(int end_a, int end_b, int n) const {
  for (int i = 0; i < n; ++i)
    if (tokens_[size_t(end_a - i)] != tokens_[size_t(end_b - i)]) return false;
  return true;
}

void NgramDrafter::append(int32_t token) {
  const int last = int(tokens_.size()) - 1;  // the n-grams ending here become lookup-able
  for (int n = min_n_; n <= max_n_ && n <= last + 1; ++n) latest_[size_t(n - min_n_)][hash(last, n)] = last;
  tokens_.push_back(token);
}

// The continuation of the match at `end` is tokens_[end+1 ..]. When it runs into the present,
// the sequence is treated as periodic with period (last - end), so a loop the model is in is
// drafted k tokens deep rather than stopping at the end of the history.
std::vector<int32_t> NgramDrafter::draft(int k) const {
  const int last = int(tokens_.size()) - 1;
  for (int n = max_n_; n >= min_n_; --n) {
    if (last + 1 <= n) continue;
    const auto& map = latest_[size_t(n - min_n_)];
    const auto it = map.find(hash(last, n));
    if (it == map.end() || !same(it->second, last, n)) continue;  // none, or a hash collision
    const int end = it->second, period = last - end;
    std::vector<int32_t> out;
    out.reserve(size_t(k));
    for (int i = 0; i < k; ++i) out.push_back(tokens_[size_t(end + 1 + i % period)]);
    return out;
  }
  return {};
}

}  // namespace petrel
