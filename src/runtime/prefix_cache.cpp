#include "runtime/prefix_cache.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace petrel {
namespace {

// splitmix64's finaliser: mixes a block's hash into the chain.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

PrefixCache::PrefixCache(const PrefixCacheOptions& options,
                         std::function<std::unique_ptr<SequenceState>(int)> new_state)
    : options_(options), new_state_(std::move(new_state)) {
  check(options_.block >= 1, "prefix cache block: expected >= 1 token, found " + std::to_string(options_.block));
  check(options_.interval >= options_.block && options_.interval % options_.block == 0,
        "prefix cache interval: expected a multiple of the block (" + std::to_string(options_.block) + "), found " +
            std::to_string(options_.interval));
}

std::vector<uint64_t> PrefixCache::block_hashes(std::span<const int32_t> prompt, size_t blocks) const {
  std::vector<uint64_t> hashes(blocks);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t i = b * size_t(options_.block); i < (b + 1) * size_t(options_.block); ++i)
      h = mix(h ^ uint32_t(prompt[i]));
    hashes[b] = h;
  }
  return hashes;
}

PrefixCache::Entry* PrefixCache::find(std::span<const int32_t> prefix, uint64_t hash) {
  const auto [first, last] = entries_.equal_range(hash);
  for (auto it = first; it != last; ++it)  // equal hashes of different tokens are told apart here
    if (std::equal(prefix.begin(), prefix.end(), it->second->tokens.begin(), it->second->tokens.end()))
      return it->second.get();
  return nullptr;
}

std::pair<PrefixCache::Entry*, size_t> PrefixCache::longest(std::span<const int32_t> tokens, size_t blocks) {
  const std::vector<uint64_t> hashes = block_hashes(tokens, blocks);
  for (size_t b = blocks; b > 0; --b) {
    const size_t n = b * size_t(options_.block);
    if (Entry* e = find(tokens.first(n), hashes[b - 1])) return {e, n};
  }
  return {nullptr, 0};
}

int PrefixCache::restore(std::span<const int32_t> prompt, SequenceState& state) {
  if (!enabled()) return 0;
  stats_.queried_tokens += prompt.size();
  const size_t blocks = prompt.size() < 2 ? 0 : (prompt.size() - 2) / size_t(options_.block);
  const int n = resume(prompt.first(blocks * size_t(options_.block)), state);
  stats_.hit_tokens += uint64_t(n);
  return n;
}

int PrefixCache::resume(std::span<const int32_t> tokens, SequenceState& state) {
  if (!enabled()) return 0;
  const auto [e, n] = longest(tokens, tokens.size() / size_t(options_.block));
  if (!e) return 0;
  state.copy_from(*e->state);
  e->last_used = ++clock_;
  return int(n);
}

int PrefixCache::last_snapshot(int size) const {
  const int block = options_.block;
  return size % block == 0 ? size : std::max(size - 2, 0) / block * block;
}

int PrefixCache::reply_snapshot(int prompt, int fed) const {
  const int end = fed / options_.block * options_.block;
  return enabled() && end > last_snapshot(prompt) ? end : 0;
}

int PrefixCache::next_snapshot(int fed, int size) const {
  if (!enabled()) return size;
  const int next_interval = (fed / options_.interval + 1) * options_.interval;
  const int next = std::min(next_interval, last_snapshot(size));
  return next > fed ? next : size;
}

void PrefixCache::offer(std::span<const int32_t> prompt, const SequenceState& state) {
  const int n = state.n_past;
  if (!enabled() || n == 0 || n % options_.block != 0 || n > int(prompt.size())) return;
  const bool at_interval = n % options_.interval == 0;
  const bool at_last = n == last_snapshot(int(prompt.size()));
  if (!at_interval && !at_last) return;
  const std::span<const int32_t> prefix = prompt.first(size_t(n));
  const uint64_t hash = block_hashes(prefix, size_t(n / options_.block)).back();
  if (Entry* e = find(prefix, hash)) {
    e->last_used = ++clock_;
    return;
  }
  auto e = std::make_unique<Entry>();
  e->tokens.assign(prefix.begin(), prefix.end());
  e->state = new_state_(n);
  e->state->copy_from(state);
  e->bytes = e->state->bytes() + e->tokens.size() * sizeof(int32_t);
  e->last_used = ++clock_;
  if (e->bytes > options_.budget_bytes) return;  // larger than the whole budget: never kept
  evict_to(options_.budget_bytes - e->bytes);
  stats_.bytes += e->bytes;
  ++stats_.snapshots;
  ++stats_.entries;
  entries_.emplace(hash, std::move(e));
}

void PrefixCache::evict_to(size_t budget) {
  while (stats_.bytes > budget && !entries_.empty()) {
    auto oldest = std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.second->last_used < b.second->last_used;
    });
    stats_.bytes -= oldest->second->bytes;
    --stats_.entries;
    ++stats_.evictions;
    entries_.erase(oldest);
  }
}

}  // namespace petrel
