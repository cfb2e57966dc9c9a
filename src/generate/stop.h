// User stop strings, matched in the streamed answer text across token boundaries.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace petrel {

// Text that could be the beginning of a stop string is held back until it is known not to be;
// a stop string and everything after it is never released. Released text is always whole UTF-8
// characters when the input is (a held-back suffix starts where a stop string starts).
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds text; returns what is now safe to show. Once a stop string matched, returns "".
  std::string push(std::string_view text);
  // The answer ended without a match: releases the held-back text.
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string* matched() const { return matched_; }

 private:
  // Length of the longest suffix of held_ that is a proper prefix of some stop string.
  size_t partial_suffix() const;

  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  const std::string* matched_ = nullptr;
};

}  // namespace petrel
