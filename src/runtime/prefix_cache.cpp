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

PrefixCache::PrefixCache(const PrefixCacheOptions& options, NewState new_state, NewState new_host_state)
    : options_(options), new_state_(std::move(new_state)), new_host_state_(std::move(new_host_state)) {
  check(options_.host_budget_bytes == 0 || new_host_state_,
        "prefix cache host_budget_bytes: expected 0 where no host state can be made, found " +
            std::to_string(options_.host_budget_bytes));
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
  const auto [e, n] = restore_longest(prompt.first(blocks * size_t(options_.block)), state);
  stats_.hit_tokens += n;
  if (e && e->host) stats_.host_hit_tokens += n;
  return int(n);
}

int PrefixCache::resume(std::span<const int32_t> tokens, SequenceState& state) {
  if (!enabled()) return 0;
  return int(restore_longest(tokens, state).second);
}

// A host entry is copied straight into the device state: it stays in host memory, since moving
// it back would push another entry out of the device budget.
std::pair<PrefixCache::Entry*, size_t> PrefixCache::restore_longest(std::span<const int32_t> tokens,
                                                                     SequenceState& state) {
  const auto [e, n] = longest(tokens, tokens.size() / size_t(options_.block));
  if (!e) return {nullptr, 0};
  state.copy_from(*e->state);
  // n is what the stats and a response's usage report as restored: the state must hold exactly that.
  check(state.n_past == int(n), "prefix cache restore: expected a state of " + std::to_string(n) +
                                    " tokens, found " + std::to_string(state.n_past));
  e->last_used = ++clock_;
  return {e, n};
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
  const int next = std::min(next_interval(fed), last_snapshot(size));
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

PrefixCache::Entries::iterator PrefixCache::oldest(bool host) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->second->host == host && (best == entries_.end() || it->second->last_used < best->second->last_used))
      best = it;
  return best;
}

void PrefixCache::evict_to(size_t budget) {
  while (stats_.bytes > budget) {
    const auto it = oldest(false);
    if (it == entries_.end()) return;
    const size_t bytes = it->second->bytes;
    if (bytes <= options_.host_budget_bytes) {
      spill(*it->second);  // where that throws (no host memory), the entry stays as it was
    } else {
      ++stats_.evictions;
      entries_.erase(it);
    }
    stats_.bytes -= bytes;
    --stats_.entries;
  }
}

// Room is made first, so that host memory never holds more than its budget.
void PrefixCache::spill(Entry& e) {
  evict_host_to(options_.host_budget_bytes - e.bytes);
  std::unique_ptr<SequenceState> host = new_host_state_(int(e.tokens.size()));
  host->copy_from(*e.state);
  e.state = std::move(host);
  e.host = true;
  stats_.host_bytes += e.bytes;
  ++stats_.host_entries;
  ++stats_.spills;
}

void PrefixCache::evict_host_to(size_t budget) {
  while (stats_.host_bytes > budget) {
    const auto it = oldest(true);
    if (it == entries_.end()) return;
    stats_.host_bytes -= it->second->bytes;
    --stats_.host_entries;
    ++stats_.evictions;
    entries_.erase(it);
  }
}

}  // namespace petrel
