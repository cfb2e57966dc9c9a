// tokenizer.json "model" of type BPE over GPT-2 byte-level symbols: ranked merges within a word.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace petrel::tokenizer {

// Hashes std::string keys so that maps can be searched with a string_view, without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// model.vocab and model.merges, read straight from the file: a JSON tree of 150k entries would
// make loading several times slower.
struct BpeTables {
  std::vector<std::pair<std::string, uint32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

class BpeModel {
 public:
  // `options` is the "model" object (its vocab and merges are in `tables`); unsupported options
  // (dropout, byte fallback, subword affixes) are an error naming the field.
  static BpeModel build(const nlohmann::json& options, BpeTables tables);

  BpeModel() = default;
  BpeModel(BpeModel&& other) noexcept;
  BpeModel& operator=(BpeModel&& other) noexcept;

  // Appends the ids of one pre-tokenized word given as raw bytes.
  void encode_word(std::string_view word, std::vector<uint32_t>& ids) const;

  // The vocab as (vocab string, id) pairs, for building the decode table.
  const std::vector<std::pair<std::string, uint32_t>>& vocab() const { return vocab_strings_; }

  // Id of a vocab entry given as raw bytes.
  std::optional<uint32_t> id_of_bytes(std::string_view bytes) const;

  // Forgets cached words (benchmarks measure a cold cache this way).
  void clear_cache() const;

 private:
  struct Merge {
    uint32_t rank;
    uint32_t merged;
  };

  // Open-addressing table from a symbol pair to its merge: the innermost lookup of encoding.
  class MergeTable {
   public:
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(uint32_t left, uint32_t right) const;

   private:
    std::vector<uint64_t> keys_;
    std::vector<Merge> values_;
    uint64_t mask_ = 0;
  };

  void merge_word(std::string_view word, std::vector<uint32_t>& ids) const;

  std::vector<std::pair<std::string, uint32_t>> vocab_strings_;
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> bytes_to_id_;
  uint32_t byte_ids_[256] = {};
  MergeTable merges_;
  bool ignore_merges_ = false;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace petrel::tokenizer
