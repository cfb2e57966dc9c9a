// Why the output is exactly that of plain decoding:
//  * Row i of the verify forward holds the logits plain decoding would compute after the tokens
//    pending, d_0 .. d_{i-1} (same prefix). Each row is sampled with the same penalty history and
//    the same randomness (uniform01(seed, position)) as plain decoding would use at that position,
//    so the sampled token is the one plain decoding would produce. Drafted tokens only decide how
//    far the rows can be trusted: while the sample equals the draft, the next row's prefix is
//    still correct. Both drafters are deterministic (prompt lookup; the head's argmax), so the
//    draft distribution q is one-hot, and "sample x ~ p, accept iff x == d" is the standard
//    speculative-sampling rule (accept d with probability min(1, p(d) / q(d)) = p(d), else draw
//    from normalize(max(0, p - q)), which is p without d). p is the sampler's processed
//    distribution: penalties see the accepted drafts, which were emitted before the next row is
//    sampled. A drafter that samples its drafts would need the general rule and its q.
//  * Rejected tokens leave no trace: the DeltaNet recurrent and conv state cannot be rewound, so
//    the verify forward runs on `scratch`, a copy of the state. If every drafted token was
//    accepted, scratch holds exactly the fed sequence and simply becomes the state (pointer swap).
//    Otherwise the real state, never touched, is advanced by re-feeding only the accepted tokens.
//    This costs one state copy per step (none of the per-position snapshots the model would
//    have to expose), plus a short re-feed on partial acceptance.
//  * Both forwards feed their tokens as decode steps do (KeepLogits::Drafted: DeltaNet a token at
//    a time, its recurrent form, where a prompt takes the chunked one), so rows and state are
//    plain decoding's, bit for bit on the CPU.
#include "generate/speculative.h"

#include <utility>

namespace petrel {

VerifyOutcome verify_draft(Decoder& decoder, std::unique_ptr<SequenceState>& st, std::unique_ptr<SequenceState>& scratch,
                           int32_t pending, const std::vector<int32_t>& draft, const EmitToken& emit,
                           const ForcedAcceptance& forced) {
  const int d = int(draft.size());
  std::vector<int32_t> fed;
  fed.reserve(size_t(d) + 1);
  fed.push_back(pending);
  fed.insert(fed.end(), draft.begin(), draft.end());

  scratch->copy_from(*st);
  decoder.feed(fed.data(), d + 1, *scratch, KeepLogits::Drafted);

  const uint64_t base = uint64_t(st->n_past) + 1;  // position of the token row 0 predicts
  VerifyOutcome out;
  int m = 0;  // index of the last emitted token among the rows
  for (;; ++m) {
    out.last = decoder.sample(m, base + uint64_t(m));
    const bool agrees = m < d && (forced ? forced(m) : out.last == draft[size_t(m)]);
    if (agrees) {
      out.last = draft[size_t(m)];
      ++out.accepted;
    }
    out.finished = !emit(out.last);
    if (out.finished || !agrees) break;
  }
  if (m == d) std::swap(st, scratch);  // scratch holds pending + the whole draft: all accepted
  else decoder.feed(fed.data(), m + 1, *st, KeepLogits::Drafted);
  return out;
}

}  // namespace petrel
