#include "generate/generator.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "core/error.h"
#include "generate/draft_policy.h"
#include "generate/ngram_draft.h"
#include "generate/rng.h"
#include "generate/speculative.h"
#include "grammar/matcher.h"

namespace petrel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void check_request(const SequenceState& st, const GenerateRequest& r) {
  const int P = int(r.tokens.size());
  check(r.max_tokens == -1 || r.max_tokens > 0,
        "max tokens: expected a positive count or -1 (no limit), found " + std::to_string(r.max_tokens));
  check(st.n_past < P, "generate: the state already holds " + std::to_string(st.n_past) +
                           " tokens of a " + std::to_string(P) + "-token sequence (nothing left to prefill)");
  check(P <= st.capacity, "the prompt is " + std::to_string(P) + " tokens but the context holds at most " +
                              std::to_string(st.capacity));
  check(r.speculative.draft >= 0, "draft length: expected >= 0, found " + std::to_string(r.speculative.draft));
  check(!r.grammar || r.speculative.draft == 0, "structured output does not combine with speculative decoding");
  const std::optional<double>& rate = r.speculative.forced_acceptance;
  if (rate && !(*rate >= 0.0 && *rate <= 1.0)) {
    char found[32];
    std::snprintf(found, sizeof found, "%g", *rate);
    throw Error(std::string("forced draft acceptance rate: expected a probability in [0, 1], found ") + found);
  }
}

// Acceptance drawn per verified row with the request's seed, so that a benchmark repeats.
ForcedAcceptance forced_acceptance(const GenerateRequest& r, uint64_t* draws) {
  if (!r.speculative.forced_acceptance) return nullptr;
  const double rate = *r.speculative.forced_acceptance;
  const uint64_t seed = r.sampling.seed;
  return [rate, seed, draws](int) { return uniform01(seed, (*draws)++) < rate; };
}

}  // namespace

// Long prompts go in pieces so that a cancel request is honoured within one piece; the piece is
// a multiple of every usual prefill chunk, so the model chunks the prompt as it would in one go.
// The MTP head reads a step's hidden rows, which the trunk keeps for one chunk: pieces of a chunk.
bool Generator::prefill(SequenceState& st, const GenerateRequest& req, int* last_step) {
  const int piece = mtp_ ? mtp_->max_rows() : 4096;
  const int P = int(req.tokens.size());
  while (P - st.n_past > piece) {
    const int from = st.n_past;
    decoder_.feed(req.tokens.data() + from, piece, st, KeepLogits::None);
    if (mtp_) mtp_->advance(req.tokens.data() + from + 1, piece);
    if (req.cancel && req.cancel->load()) return false;
  }
  *last_step = st.n_past;
  decoder_.feed(req.tokens.data() + st.n_past, P - st.n_past, st, KeepLogits::Last);
  return true;
}

MtpDrafter* Generator::mtp_for(const GenerateRequest& req, int capacity) {
  if (req.speculative.draft == 0 || req.speculative.source != DraftSource::Mtp) return nullptr;
  Model* model = decoder_.model();
  check(model && model->has_mtp(),
        "--speculative mtp needs a checkpoint with a multi-token prediction head (mtp.* tensors); this one has none");
  if (!mtp_ || mtp_->capacity() != capacity) mtp_ = std::make_unique<MtpDrafter>(*model, capacity);
  mtp_->reset();
  return mtp_.get();
}

GenerateResult Generator::generate(std::unique_ptr<SequenceState>& st, const GenerateRequest& req,
                                   const TokenSink& sink) {
  check_request(*st, req);
  const int P = int(req.tokens.size());
  GenerateResult result;
  GenerationStats& stats = result.stats;
  stats.prompt_tokens = P;
  stats.prefilled = P - st->n_past;

  decoder_.reset(req.sampling);
  for (int32_t t : req.tokens) decoder_.observe(t, false);
  std::optional<grammar::Matcher> matcher;
  if (req.grammar) matcher.emplace(req.grammar, req.eos_ids, req.reasoning);
  // The token after row 0, under the grammar's mask when there is one.
  const auto sample = [&](uint64_t position) {
    if (matcher) decoder_.set_mask(matcher->mask());
    return decoder_.sample(0, position);
  };
  std::optional<NgramDrafter> drafter;
  DraftPolicy policy(req.speculative.draft);
  MtpDrafter* const mtp = mtp_for(req, st->capacity);
  if (!mtp) mtp_.reset();
  if (req.speculative.draft > 0 && !mtp) {
    drafter.emplace(req.speculative.ngram_min, req.speculative.ngram_max);
    for (int32_t t : req.tokens) drafter->append(t);
  }

  uint64_t forced_draws = 0;
  const ForcedAcceptance forced = forced_acceptance(req, &forced_draws);

  Clock::time_point first, last;
  // Every stop rule, in order, for each sampled token; false when the answer ends with it.
  const EmitToken emit = [&](int32_t t) {
    last = Clock::now();
    if (result.tokens.empty()) first = last;
    result.tokens.push_back(t);
    decoder_.observe(t, true);
    if (matcher) matcher->accept(t);
    if (drafter) drafter->append(t);
    const auto finish = [&](FinishReason why) {
      result.reason = why;
      return false;
    };
    if (std::find(req.eos_ids.begin(), req.eos_ids.end(), t) != req.eos_ids.end()) return finish(FinishReason::Eos);
    if (!sink(t)) return finish(FinishReason::StopString);
    if (req.max_tokens > 0 && int(result.tokens.size()) >= req.max_tokens) return finish(FinishReason::MaxTokens);
    if (req.cancel && req.cancel->load()) return finish(FinishReason::Cancelled);
    return true;
  };
  // Drafts never outrun the context (the verify forward must fit) nor the token budget (the
  // bonus token after a fully accepted draft should still be wanted).
  const auto draft_budget = [&] {
    int k = std::min(policy.length(), st->capacity - st->n_past - 1);
    if (req.max_tokens > 0) k = std::min(k, req.max_tokens - int(result.tokens.size()) - 1);
    return k;
  };

  int last_step = 0;
  if (!prefill(*st, req, &last_step)) {
    result.reason = FinishReason::Cancelled;
    return result;
  }
  int32_t pending = sample(uint64_t(st->n_past));
  bool running = emit(pending);
  std::vector<int32_t> next;  // for the head: the token after each row of the trunk's last step
  if (mtp && running) {
    next.assign(req.tokens.begin() + last_step + 1, req.tokens.end());
    next.push_back(pending);
    mtp->advance(next.data(), int(next.size()));
  }
  while (running) {
    if (st->n_past >= st->capacity) {
      result.reason = FinishReason::ContextFull;
      break;
    }
    const int budget = drafter || mtp ? draft_budget() : 0;
    std::vector<int32_t> draft;
    if (budget > 0) draft = mtp ? mtp->draft(budget) : drafter->draft(budget);
    if (draft.empty()) {
      decoder_.feed(&pending, 1, *st, KeepLogits::Last);
      pending = sample(uint64_t(st->n_past));
      running = emit(pending);
      if (mtp && running) mtp->advance(&pending, 1);
      continue;
    }
    if (!scratch_ || scratch_->capacity != st->capacity) scratch_ = decoder_.new_sequence(st->capacity);
    const VerifyOutcome v = verify_draft(decoder_, st, scratch_, pending, draft, emit, forced);
    policy.update(int(draft.size()), v.accepted);
    stats.drafted += int(draft.size());
    stats.accepted += v.accepted;
    ++stats.verify_steps;
    pending = v.last;
    running = !v.finished;
    if (mtp && running) {
      // The trunk's last step fed the old pending token and the accepted drafts.
      next.assign(draft.begin(), draft.begin() + v.accepted);
      next.push_back(pending);
      mtp->advance(next.data(), int(next.size()));
    }
  }
  stats.generated = int(result.tokens.size());
  stats.ttft_s = seconds(req.start, first);
  stats.decode_s = seconds(first, last);
  return result;
}

}  // namespace petrel
