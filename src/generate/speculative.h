// One draft-verify step of speculative decoding.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "generate/decoder.h"

namespace petrel {

// Takes a sampled token into the answer; false when the answer is finished with it.
using EmitToken = std::function<bool(int32_t)>;

struct VerifyOutcome {
  int32_t last = 0;    // the last token emitted: not yet fed to the model
  int accepted = 0;    // drafted tokens that were emitted as sampled
  bool finished = false;
};

// Benchmarks on weights whose drafts are never right (random weights): decides whether row m's
// draft is taken instead of comparing it with the row's sample. A taken draft is emitted as drafted,
// so the state stays the fed sequence, and the device work is that of real acceptance.
using ForcedAcceptance = std::function<bool(int row)>;

// `st` holds the sequence up to, not including, `pending` (already emitted). Feeds pending and
// the draft in one multi-token forward on `scratch`, then samples each row in order and emits
// the result while it equals the drafted token. Afterwards `st` holds the sequence up to, not
// including, the last emitted token, exactly as plain decoding would have left it. With `forced`,
// acceptance is its answer and the output no longer follows the model.
VerifyOutcome verify_draft(Decoder& decoder, std::unique_ptr<SequenceState>& st, std::unique_ptr<SequenceState>& scratch,
                           int32_t pending, const std::vector<int32_t>& draft, const EmitToken& emit,
                           const ForcedAcceptance& forced = nullptr);

}  // namespace petrel
