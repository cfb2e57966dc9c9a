// A PCRE2 regular expression compiled for UTF-8 with Unicode properties (JIT when available).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace petrel::tokenizer {

class Regex {
 public:
  // `where` names the tokenizer.json field in error messages.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Calls on_match(begin, end) for each non-empty match in `text` (valid UTF-8), left to right.
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace petrel::tokenizer
