// The sampler: greedy is argmax, every filter yields the documented distribution (checked exactly
// and by chi-square over many draws), seeds reproduce, penalties and bias match hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "generate/penalties.h"
#include "generate/rng.h"
#include "generate/sampler.h"

namespace petrel {
namespace {

// Probabilities 0.4, 0.3, 0.2, 0.1 (as logits, shifted by an arbitrary constant).
const std::vector<float> kQuarter = {std::log(0.4f) + 3, std::log(0.3f) + 3, std::log(0.2f) + 3, std::log(0.1f) + 3};

SamplingParams params(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = 1234;
  return p;
}

// Upper 1e-6 tail of chi-square with `df` degrees of freedom (Wilson-Hilferty approximation).
double chi2_critical(int df) {
  const double z = 4.753, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Draws `n` tokens (one per position) and checks the counts against `expected`: no draw where
// the probability is zero, chi-square below its 1e-6 critical value, total variation < 0.01.
void expect_draws_match(Sampler& s, const std::vector<float>& logits, const std::vector<double>& expected, int n = 200000) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[size_t(s.sample(logits.data(), uint64_t(i)))];
  double chi2 = 0.0, tv = 0.0;
  int df = -1;
  for (size_t t = 0; t < counts.size(); ++t) {
    const double e = expected[t] * n;
    tv += std::fabs(counts[t] / double(n) - expected[t]) / 2;
    if (expected[t] == 0.0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " has probability 0 but was drawn";
      continue;
    }
    chi2 += (counts[t] - e) * (counts[t] - e) / e;
    ++df;
  }
  if (df > 0) {
    EXPECT_LT(chi2, chi2_critical(df)) << "chi-square with " << df << " degrees of freedom";
  }
  EXPECT_LT(tv, 0.01);
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

struct FilterCase {
  const char* name;
  SamplingParams p;
  std::vector<double> want;  // computed by hand from probabilities 0.4, 0.3, 0.2, 0.1
};

TEST(Sampler, EveryFilterGivesTheHandComputedDistribution) {
  const std::vector<FilterCase> cases = {
      {"temperature 1", params(1.0f), {0.4, 0.3, 0.2, 0.1}},
      {"temperature 0.5 squares p", params(0.5f), {0.16 / 0.30, 0.09 / 0.30, 0.04 / 0.30, 0.01 / 0.30}},
      {"temperature 2 takes sqrt p", params(2.0f), {}},
      {"top-k 2", params(1.0f, 2), {0.4 / 0.7, 0.3 / 0.7, 0, 0}},
      {"top-p 0.6 keeps the crossing token", params(1.0f, 0, 0.6f), {0.4 / 0.7, 0.3 / 0.7, 0, 0}},
      {"top-p 0.75", params(1.0f, 0, 0.75f), {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0}},
      {"min-p 0.3 drops p < 0.12", params(1.0f, 0, 1.0f, 0.3f), {0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0}},
      {"min-p 0.6 drops p < 0.24", params(1.0f, 0, 1.0f, 0.6f), {0.4 / 0.7, 0.3 / 0.7, 0, 0}},
      // top-k 3 renormalises to 4/9, 3/9, 2/9; top-p 0.7 then keeps 4/9 + 3/9 = 0.78 >= 0.7.
      {"top-k then top-p renormalised", params(1.0f, 3, 0.7f), {0.4 / 0.7, 0.3 / 0.7, 0, 0}},
      // temperature 0.5: 0.533, 0.3, 0.133, 0.033; top-p 0.8 keeps the first two (0.833).
      {"temperature then top-p", params(0.5f, 0, 0.8f), {0.16 / 0.25, 0.09 / 0.25, 0, 0}},
  };
  for (FilterCase c : cases) {
    SCOPED_TRACE(c.name);
    if (c.want.empty()) {  // temperature 2: p^(1/2), normalised
      const double s = std::sqrt(0.4) + std::sqrt(0.3) + std::sqrt(0.2) + std::sqrt(0.1);
      c.want = {std::sqrt(0.4) / s, std::sqrt(0.3) / s, std::sqrt(0.2) / s, std::sqrt(0.1) / s};
    }
    Sampler s(c.p, 4);
    expect_near(s.distribution(kQuarter.data()), c.want);
    expect_draws_match(s, kQuarter, c.want);
  }
}

// A straightforward reference of the filter chain (full sort), for vocabularies too large to
// work out by hand.
std::vector<double> reference(const std::vector<float>& logits, const SamplingParams& p) {
  const int V = int(logits.size());
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<int> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> w(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) w[size_t(i)] = std::exp(double((logits[size_t(i)] - top) / p.temperature));
  size_t keep = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), size_t(V)) : size_t(V);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += w[size_t(order[i])];
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += w[size_t(order[i])];
    if (cum >= p.top_p * total) {
      keep = i + 1;
      break;
    }
  }
  std::vector<double> out(static_cast<size_t>(V), 0.0);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    if (w[size_t(order[i])] >= p.min_p) sum += out[size_t(order[i])] = w[size_t(order[i])];
  for (double& x : out) x /= sum;
  return out;
}

TEST(Sampler, LargeVocabularyFiltersMatchAFullSortReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(151936);
  for (float& l : logits) l = normal(rng);
  for (const SamplingParams& p : {params(0.7f, 0, 0.95f), params(1.0f, 20, 0.8f), params(0.6f, 40, 0.95f, 0.05f),
                                  params(1.3f, 0, 0.999f), params(1.0f, 0, 1.0f, 0.2f)}) {
    SCOPED_TRACE("top_k " + std::to_string(p.top_k) + " top_p " + std::to_string(p.top_p));
    Sampler s(p, int(logits.size()));
    const std::vector<double> got = s.distribution(logits.data()), want = reference(logits, p);
    int kept = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i] > 0, want[i] > 0) << "token " << i << " kept by one and not the other";
      EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]);  // z is computed in float
      kept += got[i] > 0;
    }
    EXPECT_GT(kept, 1);
  }
}

TEST(Sampler, GreedyPicksTheArgmax) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-10.0f, 10.0f);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> logits(1000);
    for (float& l : logits) l = u(rng);
    Sampler s(params(0.0f), 1000);
    const int32_t want = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(argmax(logits.data(), 1000), want);
    EXPECT_EQ(s.sample(logits.data(), uint64_t(trial)), want);
  }
  const std::vector<float> tie = {1.0f, 5.0f, 5.0f};
  EXPECT_EQ(argmax(tie.data(), 3), 1) << "ties go to the lowest index";
}

TEST(Sampler, SameSeedSameTokensAndDrawsDependOnlyOnPosition) {
  std::vector<float> logits(500);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (float& l : logits) l = normal(rng);
  SamplingParams p = params(0.9f, 50, 0.9f);
  Sampler a(p, 500), b(p, 500);
  std::vector<int32_t> forward, backward(64);
  for (int i = 0; i < 64; ++i) forward.push_back(a.sample(logits.data(), uint64_t(i)));
  for (int i = 63; i >= 0; --i) backward[size_t(i)] = b.sample(logits.data(), uint64_t(i));
  EXPECT_EQ(forward, backward);
  p.seed += 1;
  Sampler c(p, 500);
  std::vector<int32_t> other;
  for (int i = 0; i < 64; ++i) other.push_back(c.sample(logits.data(), uint64_t(i)));
  EXPECT_NE(forward, other) << "a different seed should give different tokens";
}

// Sequence: prompt 0 1, generated 2 2 3. Logits 2, -1, 0.5, 3, 0.
//   token 0 (prompt):      2 / 2                        = 1
//   token 1 (prompt):     -1 * 2                        = -2
//   token 2 (generated 2x): 0.5 / 2 - 0.5 - 0.25 * 2    = -0.75
//   token 3 (generated 1x): 3 / 2 - 0.5 - 0.25          = 0.75
//   token 4 (unseen):       0
// The draw inverts the CDF of the kept tokens taken in id order, whatever order the filters left
// them in (the device sampler reproduces exactly this order).
TEST(Sampler, DrawWalksTheKeptTokensInIdOrder) {
  // Probabilities 0.1, 0.4, 0.2, 0.3: top-k 3 and top-p 0.85 both keep ids 1, 2, 3.
  const std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f), std::log(0.3f)};
  for (const SamplingParams& p : {params(1.0f, 3), params(1.0f, 0, 0.85f)}) {
    Sampler s(p, 4);
    const double bounds[] = {0.4 / 0.9, 0.6 / 0.9};  // CDF over ids 1, 2, 3
    int checked = 0;
    for (uint64_t pos = 0; pos < 2000; ++pos) {
      const double u = uniform01(p.seed, pos);
      if (std::fabs(u - bounds[0]) < 1e-6 || std::fabs(u - bounds[1]) < 1e-6) continue;  // rounding
      const int32_t want = u < bounds[0] ? 1 : u < bounds[1] ? 2 : 3;
      ASSERT_EQ(s.sample(logits.data(), pos), want) << "position " << pos << ", u " << u;
      ++checked;
    }
    EXPECT_GT(checked, 1990);
  }
}

TEST(Penalties, MatchHandComputedValues) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  PenaltyState st;
  for (int32_t t : {0, 1}) st.add(t, false);
  for (int32_t t : {2, 2, 3}) st.add(t, true);
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  st.apply(p, l.data());
  EXPECT_EQ(l, (std::vector<float>{1.0f, -2.0f, -0.75f, 0.75f, 0.0f}));

  apply_logit_bias({{4, 1.5f}, {0, -100.0f}}, l.data());
  EXPECT_EQ(l, (std::vector<float>{-99.0f, -2.0f, -0.75f, 0.75f, 1.5f}));
}

TEST(Penalties, WindowForgetsOlderTokens) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 1.0f;
  PenaltyState st(3);
  for (int32_t t : {0, 1}) st.add(t, false);
  for (int32_t t : {2, 2, 3}) st.add(t, true);  // window: 2 2 3
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  st.apply(p, l.data());
  EXPECT_EQ(l, (std::vector<float>{2.0f, -1.0f, 0.25f - 2.0f, 1.5f - 1.0f, 0.0f}));
}

TEST(Sampler, AppliesPenaltiesAndBiasBeforeTemperature) {
  SamplingParams p = params(0.5f);
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.logit_bias = {{4, 1.5f}};
  Sampler s(p, 5);
  s.observe(0, false);
  s.observe(1, false);
  for (int32_t t : {2, 2, 3}) s.observe(t, true);
  const std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  const std::vector<double> adjusted = {1.0, -2.0, -0.75, 0.75, 1.5};
  std::vector<double> want(5);
  double sum = 0;
  for (int i = 0; i < 5; ++i) sum += want[size_t(i)] = std::exp(adjusted[size_t(i)] / 0.5);
  for (double& w : want) w /= sum;
  expect_near(s.distribution(l.data()), want);
  expect_draws_match(s, l, want);
}

TEST(Sampler, BiasOfMinusInfinityBansAToken) {
  SamplingParams p = params(1.0f);
  p.logit_bias = {{0, -INFINITY}};
  Sampler s(p, 4);
  expect_draws_match(s, kQuarter, {0.0, 0.5, 2.0 / 6, 1.0 / 6});
  SamplingParams greedy = params(0.0f);
  greedy.logit_bias = {{0, -INFINITY}};
  EXPECT_EQ(Sampler(greedy, 4).sample(kQuarter.data(), 0), 1);
}

// 1/T overflows a float below ~2.9e-39: the draw would see no candidate at all, so it is greedy.
TEST(Sampler, TemperatureTooSmallToInvertSamplesGreedily) {
  for (float t : {1e-39f, 2.9e-39f, 1e-45f}) {
    SamplingParams p = params(t);
    EXPECT_TRUE(p.greedy()) << t;
    Sampler s(p, 4);
    for (uint64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(s.sample(kQuarter.data(), pos), 0) << t;
    expect_near(s.distribution(kQuarter.data()), {1.0, 0.0, 0.0, 0.0});
  }
  EXPECT_FALSE(params(1e-37f).greedy());
  EXPECT_EQ(Sampler(params(1e-37f), 4).sample(kQuarter.data(), 0), 0);
}

// A tiny repetition penalty divides a positive logit past the float range: +inf tokens share the
// whole probability, the rest get none (without the rule, inf - inf = NaN left no candidate).
TEST(Sampler, InfiniteLogitsShareTheWholeProbability) {
  SamplingParams p = params(1.0f, 0, 0.5f, 0.5f);
  p.repetition_penalty = 1e-38f;
  Sampler s(p, 4);
  s.observe(1, false);
  s.observe(2, false);
  const std::vector<float> logits = {1.0f, 5.0f, 6.0f, 2.0f};
  EXPECT_EQ(s.distribution(logits.data()), (std::vector<double>{0.0, 1.0, 0.0, 0.0})) << "top-p keeps one of two";
  SamplingParams all = params(1.0f);
  all.repetition_penalty = 1e-38f;
  Sampler t(all, 4);
  t.observe(1, false);
  t.observe(2, false);
  expect_near(t.distribution(logits.data()), {0.0, 0.5, 0.5, 0.0});
  expect_draws_match(t, logits, {0.0, 0.5, 0.5, 0.0}, 20000);
}

// The filters at their limits still keep the top token: never an empty candidate set.
TEST(Sampler, ExtremeFiltersKeepTheTopToken) {
  for (const SamplingParams& p : {params(1.0f, 1), params(1.0f, 0, 1e-38f), params(1.0f, 0, 1.0f, 1.0f),
                                  params(100.0f, 1, 1e-38f, 1.0f), params(1e-37f, 0, 1e-38f, 1e-38f),
                                  params(1.0f, 1 << 30)}) {
    Sampler s(p, 4);
    for (uint64_t pos = 0; pos < 20; ++pos) {
      const int32_t token = s.sample(kQuarter.data(), pos);
      EXPECT_TRUE(token >= 0 && token < 4) << token;
      if (p.top_k == 1 || p.top_p < 1e-30f || p.min_p == 1.0f) EXPECT_EQ(token, 0);
    }
  }
}

TEST(Sampler, RejectsOutOfRangeParametersNamingTheField) {
  const auto message = [](SamplingParams p) {
    try {
      Sampler s(p, 10);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_NE(message(p).find("top_p"), std::string::npos);
  p = {};
  p.min_p = 1.5f;
  EXPECT_NE(message(p).find("min_p: expected a number in [0, 1], found 1.5"), std::string::npos) << message(p);
  p = {};
  p.temperature = -1.0f;
  EXPECT_NE(message(p).find("temperature"), std::string::npos);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(message(p).find("repetition_penalty"), std::string::npos);
  p = {};
  p.logit_bias = {{10, 1.0f}};
  EXPECT_NE(message(p).find("token id 10 is outside the vocabulary (0..9)"), std::string::npos) << message(p);
}

}  // namespace
}  // namespace petrel
