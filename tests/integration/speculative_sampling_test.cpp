// Speculative sampling keeps the output distribution: over many seeds, the first two tokens a
// verify step yields (continued by a plain step when it stops after one) are distributed as the
// processed distributions say (penalties, temperature, top-k, top-p), p(x) · p(y | x). A
// chi-square test of the counts against that law, with a draft that is often but not always
// right, so both the accepting and the rejecting path are sampled. Seeds are fixed: no flakiness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "cpu_fixture.h"
#include "generate/host_decoder.h"
#include "generate/rng.h"
#include "generate/sampler.h"
#include "generate/speculative.h"

namespace petrel {
namespace {

using Pair = std::pair<int32_t, int32_t>;
constexpr int kSeeds = 4000;
constexpr int32_t kPending = 17;  // the token sampled last, fed first in the verify step

SamplingParams processed() {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 4;
  p.top_p = 0.97f;
  p.repetition_penalty = 1.4f;
  p.presence_penalty = 0.3f;
  return p;
}

std::vector<int32_t> prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 24; ++i) p.push_back((i * 37 + 11) % 256);
  return p;
}

int32_t most_likely(const std::vector<double>& p) { return int32_t(std::max_element(p.begin(), p.end()) - p.begin()); }

// The exact law of the two tokens after prompt + pending, each step's distribution computed with
// the penalty history the sampler would have at that point.
struct Law {
  std::vector<double> first;                             // p(x)
  std::map<int32_t, std::vector<double>> second;         // p(y | x) for each x with p(x) > 0

  Law(Model& model, const std::vector<int32_t>& prompt, const SamplingParams& params) {
    const int V = model.config().vocab;
    std::vector<int32_t> seq = prompt;
    seq.push_back(kPending);
    first = distribution(model, seq, int(prompt.size()), params);
    for (int32_t x = 0; x < V; ++x) {
      if (first[size_t(x)] == 0.0) continue;
      seq.push_back(x);
      second[x] = distribution(model, seq, int(prompt.size()), params);
      seq.pop_back();
    }
  }

  double operator()(Pair xy) const {
    const auto it = second.find(xy.first);
    return it == second.end() ? 0.0 : first[size_t(xy.first)] * it->second[size_t(xy.second)];
  }

 private:
  // The sampler's distribution after `seq`, whose tokens past `prompt_len` were generated.
  static std::vector<double> distribution(Model& model, const std::vector<int32_t>& seq, int prompt_len,
                                          const SamplingParams& params) {
    const int V = model.config().vocab;
    auto st = model.new_sequence(int(seq.size()));
    std::vector<float> logits(static_cast<size_t>(V));
    model.forward(seq.data(), int(seq.size()), *st, logits.data());
    Sampler sampler(params, V);
    for (size_t i = 0; i < seq.size(); ++i) sampler.observe(seq[i], int(i) >= prompt_len);
    return sampler.distribution(logits.data());
  }
};

// Pearson's chi-square of the counts against the law; a count where the law says 0 is infinite.
double chi_square(const std::map<Pair, int>& counts, const Law& law, int n, int* cells) {
  double chi2 = 0.0;
  *cells = 0;
  for (const auto& [x, px] : law.second)
    for (size_t y = 0; y < px.size(); ++y) {
      const double expected = n * law({x, int32_t(y)});
      if (expected == 0.0) continue;
      ++*cells;
      const auto it = counts.find({x, int32_t(y)});
      const double seen = it == counts.end() ? 0.0 : it->second;
      chi2 += (seen - expected) * (seen - expected) / expected;
    }
  for (const auto& [xy, c] : counts)
    if (law(xy) == 0.0) return INFINITY;
  return chi2;
}

// Far in the upper tail: about 4.5 standard deviations above the mean (df, variance 2·df).
double threshold(int cells) {
  const double df = cells - 1;
  return df + 4.5 * std::sqrt(2.0 * df);
}

class SpeculativeSampling : public ::testing::Test {
 protected:
  test::CpuFixture f{"qwen35moe-mtp"};
  std::vector<int32_t> prompt_ = prompt();
  SamplingParams params_ = processed();
  Law law_{*f.model, prompt_, params_};

  // The draft a good drafter would make: the most likely token, then the most likely after it.
  std::vector<int32_t> likely_draft() const {
    const int32_t a = most_likely(law_.first);
    return {a, most_likely(law_.second.at(a))};
  }

  // The first two tokens after prompt + pending for each seed, from a verify step of `draft`.
  std::map<Pair, int> sample_pairs(const std::vector<int32_t>& draft, int* accepted) {
    HostDecoder decoder(*f.model);
    const int cap = int(prompt_.size()) + 8;
    auto prefilled = f.model->new_sequence(cap);
    f.model->forward(prompt_.data(), int(prompt_.size()), *prefilled, nullptr);
    auto st = f.model->new_sequence(cap), scratch = f.model->new_sequence(cap);
    std::map<Pair, int> counts;
    *accepted = 0;
    for (int s = 0; s < kSeeds; ++s) {
      SamplingParams p = params_;
      p.seed = uint64_t(s);
      decoder.reset(p);
      for (int32_t t : prompt_) decoder.observe(t, false);
      decoder.observe(kPending, true);
      st->copy_from(*prefilled);
      std::vector<int32_t> out;
      const VerifyOutcome v = verify_draft(decoder, st, scratch, kPending, draft, [&](int32_t t) {
        out.push_back(t);
        decoder.observe(t, true);
        return true;
      });
      *accepted += v.accepted;
      if (out.size() < 2) {  // the plain step that follows a rejection at the first row
        decoder.feed(&v.last, 1, *st, KeepLogits::Last);
        out.push_back(decoder.sample(0, uint64_t(st->n_past)));
      }
      ++counts[{out[0], out[1]}];
    }
    return counts;
  }
};

TEST_F(SpeculativeSampling, KeepsTheDistributionOfPlainSampling) {
  const std::vector<int32_t> draft = likely_draft();
  const double p_first = law_.first[size_t(draft[0])];
  ASSERT_GT(p_first, 0.2) << "the draft should be accepted often";
  ASSERT_LT(p_first, 0.8) << "and rejected often";
  int accepted = 0;
  const std::map<Pair, int> counts = sample_pairs(draft, &accepted);
  EXPECT_GT(accepted, kSeeds / 5);
  int cells = 0;
  const double chi2 = chi_square(counts, law_, kSeeds, &cells);
  ASSERT_GT(cells, 4);
  EXPECT_LT(chi2, threshold(cells)) << cells << " cells, " << accepted << " drafted tokens accepted";
}

// A draft the target never samples (outside top-k) is always rejected; what is emitted instead
// must still follow the law.
TEST_F(SpeculativeSampling, RejectedDraftsStillFollowTheLaw) {
  int32_t never = 0;
  while (law_.first[size_t(never)] > 0.0) ++never;
  int accepted = 0;
  const std::map<Pair, int> counts = sample_pairs({never, never}, &accepted);
  EXPECT_EQ(accepted, 0);
  int cells = 0;
  const double chi2 = chi_square(counts, law_, kSeeds, &cells);
  EXPECT_LT(chi2, threshold(cells));
}

// The test has the power to see a wrong rule: "accept the draft with probability p(d), else draw
// again from p" (d not removed) emits d too often, and the same counts and threshold refuse it.
TEST_F(SpeculativeSampling, TheTestRefusesARuleThatDoesNotRemoveTheDraft) {
  const std::vector<int32_t> draft = likely_draft();
  const int V = f.vocab();
  std::map<Pair, int> counts;
  for (int s = 0; s < kSeeds; ++s) {
    const auto draw = [&](const std::vector<double>& p, uint64_t position) {
      double u = uniform01(uint64_t(s), position), cum = 0.0;
      for (int t = 0; t < V; ++t)
        if ((cum += p[size_t(t)]) > u) return int32_t(t);
      return int32_t(V - 1);
    };
    const bool take = uniform01(uint64_t(s) + kSeeds, 0) < law_.first[size_t(draft[0])];
    const int32_t x = take ? draft[0] : draw(law_.first, 0);
    ++counts[{x, draw(law_.second.at(x), 1)}];
  }
  int cells = 0;
  const double chi2 = chi_square(counts, law_, kSeeds, &cells);
  EXPECT_GT(chi2, threshold(cells));
}

}  // namespace
}  // namespace petrel
