// How many tokens to draft next. Speculation is exact whatever the length; only speed depends
// on it: each drafted row costs verify work (with MoE models, more distinct experts read), and a
// step that accepts nothing costs a whole extra forward. So drafts follow recent acceptance.
#pragma once
#include <algorithm>

namespace petrel {

class DraftPolicy {
 public:
  explicit DraftPolicy(int max_draft) : max_(max_draft), next_(max_draft) {}

  // Draft length for this step; 0 while backing off after drafts that were all rejected.
  int length() {
    if (pause_ > 0) {
      --pause_;
      return 0;
    }
    return next_;
  }

  // After a verification: draft one more than was accepted, growing after full acceptance;
  // after nothing accepted, decode plainly for 1, 2, 4, ... 32 steps before trying again.
  void update(int drafted, int accepted) {
    next_ = accepted == drafted ? std::min(max_, drafted + 2) : std::max(1, accepted + 1);
    if (accepted > 0) {
      backoff_ = 1;
      return;
    }
    pause_ = backoff_;
    backoff_ = std::min(backoff_ * 2, 32);
  }

 private:
  int max_, next_;
  int pause_ = 0, backoff_ = 1;
};

}  // namespace petrel
