// tokenizer.json "pre_tokenizer": splits normalized text into the words that BPE merges within.
#pragma once
#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tokenizer/regex.h"

namespace petrel::tokenizer {

// How a Split step treats the text its pattern matched (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
  std::shared_ptr<const Regex> regex;  // null when the pattern is a literal string
  std::string literal;
  SplitBehavior behavior = SplitBehavior::Isolated;
};

struct ByteLevelStep {
  bool add_prefix_space = false;
  bool use_regex = false;  // then the piece is split further with GPT-2's pattern
};

class PreTokenizer {
 public:
  // Reads the "pre_tokenizer" value; unsupported types and options are an error naming them.
  static PreTokenizer from_json(const nlohmann::json& j);

  // Whether a ByteLevel step is present (the BPE model works on bytes only then).
  bool has_byte_level() const;

  // Splits `text` into words, appended to `words`. Words may point into `text` or into `arena`,
  // which holds text the steps had to create (a prefix space).
  void split(std::string_view text, std::vector<std::string_view>& words, std::deque<std::string>& arena) const;

 private:
  std::vector<std::variant<SplitStep, ByteLevelStep>> steps_;
};

}  // namespace petrel::tokenizer
