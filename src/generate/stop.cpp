#include "generate/stop.h"

#include <algorithm>

#include "core/error.h"

namespace petrel {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) check(!s.empty(), "stop strings: an empty stop string would stop at once");
}

size_t StopMatcher::partial_suffix() const {
  size_t best = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > best; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = &s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  const size_t release = held_.size() - partial_suffix();
  std::string out = held_.substr(0, release);
  held_.erase(0, release);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace petrel
