#include "tokenizer/bpe.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace petrel::tokenizer {
namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};
constexpr size_t kCacheCapacity = 1 << 17;
constexpr size_t kMaxCachedWordBytes = 256;

uint64_t pair_key(uint32_t left, uint32_t right) { return (uint64_t{left} << 32) | right; }

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

void require_absent_or(const nlohmann::json& model, const char* field, const nlohmann::json& allowed) {
  if (!model.contains(field) || model[field].is_null() || model[field] == allowed) return;
  throw Error(std::string("tokenizer.json: BPE model option \"") + field + "\": " + model[field].dump() +
              " is not supported (expected " + allowed.dump() + ")");
}

struct Symbol {
  uint32_t id;
  int prev, next;
  bool alive;
};

struct Candidate {
  uint32_t rank;
  int pos;
  uint32_t left, right, merged;
  // Lowest rank first; among equal ranks the leftmost, as Hugging Face orders them.
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

BpeModel::BpeModel(BpeModel&& other) noexcept { *this = std::move(other); }

BpeModel& BpeModel::operator=(BpeModel&& other) noexcept {
  vocab_strings_ = std::move(other.vocab_strings_);
  bytes_to_id_ = std::move(other.bytes_to_id_);
  std::copy(std::begin(other.byte_ids_), std::end(other.byte_ids_), byte_ids_);
  merges_ = std::move(other.merges_);
  ignore_merges_ = other.ignore_merges_;
  cache_ = std::move(other.cache_);
  return *this;
}

void BpeModel::MergeTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t capacity = 16;
  while (capacity < entries.size() * 2) capacity <<= 1;
  keys_.assign(capacity, kEmptyKey);
  values_.assign(capacity, Merge{});
  mask_ = capacity - 1;
  for (const auto& [key, merge] : entries) {
    uint64_t slot = mix(key) & mask_;
    while (keys_[slot] != kEmptyKey && keys_[slot] != key) slot = (slot + 1) & mask_;
    keys_[slot] = key;  // a repeated pair keeps its last rank, as a Hugging Face HashMap does
    values_[slot] = merge;
  }
}

const BpeModel::Merge* BpeModel::MergeTable::find(uint32_t left, uint32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & mask_;; slot = (slot + 1) & mask_) {
    if (keys_[slot] == key) return &values_[slot];
    if (keys_[slot] == kEmptyKey) return nullptr;
  }
}

BpeModel BpeModel::build(const nlohmann::json& model, BpeTables tables) {
  const std::string type = model.value("type", "");
  if (type != "BPE") throw Error("tokenizer.json: model type '" + type + "' is not supported (expected BPE)");
  require_absent_or(model, "dropout", nullptr);
  require_absent_or(model, "byte_fallback", false);
  require_absent_or(model, "continuing_subword_prefix", "");
  require_absent_or(model, "end_of_word_suffix", "");

  BpeModel m;
  m.ignore_merges_ = model.value("ignore_merges", false);
  m.bytes_to_id_.reserve(tables.vocab.size());
  for (const auto& [token, id] : tables.vocab)
    if (auto bytes = byte_level::to_bytes(token)) m.bytes_to_id_.emplace(std::move(*bytes), id);
  for (int b = 0; b < 256; ++b) {
    const auto id = m.id_of_bytes(std::string(1, static_cast<char>(b)));
    if (!id) throw Error("tokenizer.json: byte-level BPE vocab lacks a token for byte " + std::to_string(b));
    m.byte_ids_[b] = *id;
  }

  std::vector<std::pair<uint64_t, Merge>> entries;
  entries.reserve(tables.merges.size());
  // Merges are looked up by the bytes their symbols stand for: the only spelling words have.
  auto lookup = [&](const std::string& token, size_t rank) {
    const auto bytes = byte_level::to_bytes(token);
    const auto id = bytes ? m.id_of_bytes(*bytes) : std::nullopt;
    if (!id)
      throw Error("tokenizer.json: model.merges[" + std::to_string(rank) + "] uses '" + token +
                  "', which is not a byte-level token of model.vocab");
    return *id;
  };
  for (size_t rank = 0; rank < tables.merges.size(); ++rank) {
    const auto& [left, right] = tables.merges[rank];
    entries.push_back({pair_key(lookup(left, rank), lookup(right, rank)),
                       Merge{static_cast<uint32_t>(rank), lookup(left + right, rank)}});
  }
  m.merges_.build(entries);
  m.vocab_strings_ = std::move(tables.vocab);
  return m;
}

std::optional<uint32_t> BpeModel::id_of_bytes(std::string_view bytes) const {
  auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::clear_cache() const {
  std::lock_guard lock(cache_mutex_);
  cache_.clear();
}

void BpeModel::encode_word(std::string_view word, std::vector<uint32_t>& ids) const {
  if (word.size() == 1) {
    ids.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    if (auto id = id_of_bytes(word)) {
      ids.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  merge_word(word, ids);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::vector<uint32_t>(ids.begin() + first, ids.end()));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<uint32_t>& ids) const {
  // Per-thread scratch: merging runs once per new word, and allocating each time dominated it.
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  const int n = static_cast<int>(word.size());
  symbols.resize(n);
  heap.clear();
  for (int i = 0; i < n; ++i) symbols[i] = {byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true};

  auto consider = [&](int pos) {
    const int next = symbols[pos].next;
    if (next < 0) return;
    if (const Merge* m = merges_.find(symbols[pos].id, symbols[next].id)) {
      heap.push_back({m->rank, pos, symbols[pos].id, symbols[next].id, m->merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.pos];
    // Skip candidates made stale by an earlier merge of either symbol.
    if (!left.alive || left.id != c.left || left.next < 0 || symbols[left.next].id != c.right) continue;
    Symbol& right = symbols[left.next];
    left.id = c.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace petrel::tokenizer
