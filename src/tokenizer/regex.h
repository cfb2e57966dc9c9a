// A PCRE2 regular expression compiled for UTF-8 with Unicode properties (JIT when available).
#pragma once
#include <cstddef>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace petrel::tokenizer {

class Regex {
 public:
  // `where` names the tokenizer.json field in error messages.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // The first non-empty match in `text` (valid UTF-8) starting at or after `offset`, as
  // [begin, end) byte offsets, or nullopt.
  std::optional<std::pair<size_t, size_t>> find(std::string_view text, size_t offset) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace petrel::tokenizer
