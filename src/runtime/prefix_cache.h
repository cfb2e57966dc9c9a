// Prompt prefixes the scheduler has already prefilled, kept as sequence-state snapshots so that a
// request repeating one (a chat's next turn, an agent's next step, a shared system prompt) restores
// it and prefills only the rest. A hybrid model's DeltaNet state cannot be cut back to an earlier
// position, so a snapshot is taken exactly at a block boundary while the prompt is fed: at the last
// boundary of every prompt and every `interval` tokens of long ones. A request that ended with a
// reply is snapshotted at the last block boundary of its reply too (reply_snapshot): a chat's next
// turn resends it. Entries are keyed by chained hashes of their token blocks and evicted least
// recently used under a byte budget. With a host budget, an entry the device budget pushes out is
// spilled instead: copied to a state in host memory (slower to restore, but far cheaper than a
// prefill), where the least recently used are dropped under that second budget.
// Neither a restore nor a snapshot leaves exactly one prompt token to feed: a one-token piece runs
// as a decode step, which rounds differently from the prefill piece it would be part of without
// the cache.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace petrel {

struct PrefixCacheOptions {
  size_t budget_bytes = size_t(4) << 30;  // snapshots held at once; 0 turns the cache off
  int block = 64;      // snapshot positions are multiples of this many tokens
  int interval = 2048; // long prompts: a snapshot every this many tokens too (a multiple of block)
  size_t host_budget_bytes = 0;  // snapshots spilled to host memory; 0: evicted ones are dropped
};

struct PrefixCacheStats {
  uint64_t queried_tokens = 0;  // prompt tokens looked up
  uint64_t hit_tokens = 0;      // of those, restored from a snapshot
  uint64_t host_hit_tokens = 0; // of those, from a snapshot in host memory
  uint64_t snapshots = 0;
  uint64_t spills = 0;     // snapshots moved to host memory under the device budget
  uint64_t evictions = 0;  // snapshots dropped, from either memory
  size_t bytes = 0, host_bytes = 0;  // held now, on the device and in host memory
  int entries = 0, host_entries = 0;
};

class PrefixCache {
 public:
  using NewState = std::function<std::unique_ptr<SequenceState>(int)>;
  // new_state(capacity) allocates an empty sequence state of the model (Model::new_sequence),
  // new_host_state one in host memory (Model::new_host_sequence), called only with a host budget.
  PrefixCache(const PrefixCacheOptions& options, NewState new_state, NewState new_host_state = nullptr);

  bool enabled() const { return options_.budget_bytes > 0; }
  // Restores into `state` (empty) the longest snapshot that is a prefix of `prompt` and leaves at
  // least two of its tokens to feed; returns its length, 0 if none.
  int restore(std::span<const int32_t> prompt, SequenceState& state);
  // Restores into `state` (empty) the longest snapshot that is a prefix of `tokens`, all of them at
  // most; returns its length, 0 if none. Not a lookup of a prompt: the stats do not count it.
  int resume(std::span<const int32_t> tokens, SequenceState& state);
  // The next position after `fed` at which a prompt of `size` tokens is snapshotted: feeding
  // should stop there. size when there is none.
  int next_snapshot(int fed, int size) const;
  // The first interval position after `fed` (a long prompt's snapshots).
  int next_interval(int fed) const { return (fed / options_.interval + 1) * options_.interval; }
  bool at_interval(int n) const { return n > 0 && n % options_.interval == 0; }
  int block() const { return options_.block; }
  // Called once `state` holds exactly the first state.n_past tokens of `prompt`: snapshots it
  // where that is a snapshot position not cached yet.
  void offer(std::span<const int32_t> prompt, const SequenceState& state);
  // A request of `prompt` tokens ended after feeding `fed` tokens in all (its prompt and its reply
  // but the last token, never fed): the position its reply is snapshotted at, the last block
  // boundary of what it fed; 0 when that is not past the prompt's last snapshot.
  int reply_snapshot(int prompt, int fed) const;
  // The prompt's last snapshot position: its end when that is a block boundary, else the last
  // boundary that leaves two tokens or more.
  int last_snapshot(int size) const;
  PrefixCacheStats stats() const { return stats_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<SequenceState> state;
    size_t bytes = 0;
    uint64_t last_used = 0;
    bool host = false;  // state is in host memory
  };
  using Entries = std::unordered_multimap<uint64_t, std::unique_ptr<Entry>>;
  // The longest snapshot that is a prefix of `tokens`, of at most `blocks` whole blocks, and its
  // length; null if none.
  std::pair<Entry*, size_t> longest(std::span<const int32_t> tokens, size_t blocks);
  // Hashes of prompt[0, (i+1)·block) for each whole block i, chained block by block.
  std::vector<uint64_t> block_hashes(std::span<const int32_t> prompt, size_t blocks) const;
  Entry* find(std::span<const int32_t> prefix, uint64_t hash);
  // Restores into `state` the longest snapshot that is a prefix of `tokens`; the entry and its
  // length, null if none.
  std::pair<Entry*, size_t> restore_longest(std::span<const int32_t> tokens, SequenceState& state);
  // Spills or drops device entries, least recently used first, until their bytes are <= budget.
  void evict_to(size_t budget);
  // Drops host entries, least recently used first, until their bytes are <= budget.
  void evict_host_to(size_t budget);
  void spill(Entry& e);
  // The least recently used entry in host memory (`host`) or on the device; end() if none.
  Entries::iterator oldest(bool host);

  PrefixCacheOptions options_;
  NewState new_state_, new_host_state_;
  Entries entries_;
  uint64_t clock_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace petrel
