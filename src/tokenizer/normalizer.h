// tokenizer.json "normalizer": the Unicode normalization forms, alone or in a Sequence.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace petrel::tokenizer {

class Normalizer {
 public:
  enum class Form { NFC, NFD, NFKC, NFKD };

  // Reads the "normalizer" value (null means none); other normalizer types are an error.
  static Normalizer from_json(const nlohmann::json& j);

  // Whether apply(text) would return `text` unchanged without looking closer (ASCII, or no forms).
  bool trivially_unchanged(std::string_view text) const;
  std::string apply(std::string_view text) const;

 private:
  std::vector<Form> forms_;
};

}  // namespace petrel::tokenizer
