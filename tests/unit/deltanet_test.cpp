// Chunked (WY) and recurrent gated delta rule compute the same function (fp32).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"

namespace petrel {
namespace {

struct Inputs {
  cpu::DeltaNetDims d;
  int T;
  std::vector<float> q, k, v, beta, g, state;
};

void l2norm_heads(std::vector<float>& x, int dk, float scale) {
  for (size_t h = 0; h < x.size() / dk; ++h) {
    float ss = 0;
    for (int i = 0; i < dk; ++i) ss += x[h * dk + i] * x[h * dk + i];
    const float inv = scale / std::sqrt(ss + 1e-6f);
    for (int i = 0; i < dk; ++i) x[h * dk + i] *= inv;
  }
}

Inputs make_inputs(int T, uint32_t seed) {
  Inputs in;
  in.d = {2, 4, 16, 24};  // Hk != Hv, dk != dv
  in.T = T;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, size_t count) {
    x.resize(count);
    for (auto& e : x) e = n(rng);
  };
  const auto& d = in.d;
  fill(in.q, size_t(T) * d.Hk * d.dk);
  fill(in.k, size_t(T) * d.Hk * d.dk);
  fill(in.v, size_t(T) * d.Hv * d.dv);
  fill(in.state, size_t(d.Hv) * d.dk * d.dv);  // nonzero initial state
  l2norm_heads(in.q, d.dk, 1.0f / std::sqrt(float(d.dk)));
  l2norm_heads(in.k, d.dk, 1.0f);
  in.beta.resize(size_t(T) * d.Hv);
  in.g.resize(size_t(T) * d.Hv);
  for (size_t i = 0; i < in.beta.size(); ++i) {
    in.beta[i] = u(rng);
    // g = -exp(A_log)·softplus(a + dt_bias) with A up to 16: strong decays included.
    const float A = 1.0f + 15.0f * u(rng);
    in.g[i] = -A * cpu::softplus(n(rng));
  }
  return in;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

class DeltaRuleChunkedVsRecurrent : public ::testing::TestWithParam<int> {};

TEST_P(DeltaRuleChunkedVsRecurrent, OutputsAndFinalStateAgree) {
  const int T = GetParam();
  Inputs in = make_inputs(T, 1000 + T);
  const auto& d = in.d;
  std::vector<float> s_rec = in.state, s_chk = in.state;
  std::vector<float> o_rec(size_t(T) * d.Hv * d.dv, NAN), o_chk(size_t(T) * d.Hv * d.dv, NAN);
  cpu::delta_rule_recurrent(d, T, in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), s_rec.data(),
                            o_rec.data());
  cpu::delta_rule_chunked(d, T, in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), s_chk.data(),
                          o_chk.data(), 64);
  EXPECT_LT(rel_err(o_chk, o_rec), 1e-5) << "T=" << T;
  EXPECT_LT(rel_err(s_chk, s_rec), 1e-5) << "T=" << T;
  EXPECT_GT(rel_err(s_rec, in.state), 1e-3) << "the state must actually change";
}

INSTANTIATE_TEST_SUITE_P(Lengths, DeltaRuleChunkedVsRecurrent, ::testing::Values(1, 63, 64, 65, 200));

TEST(DeltaRuleRecurrent, MatchesHandComputedStep) {
  // One head, dk = dv = 1: S' = e^g S + k·β(v − e^g S k); o = S' q.
  cpu::DeltaNetDims d{1, 1, 1, 1};
  float q = 0.5f, k = 1.0f, v = 2.0f, beta = 0.25f, g = std::log(0.5f), S = 4.0f, o = 0;
  cpu::delta_rule_recurrent(d, 1, &q, &k, &v, &beta, &g, &S, &o);
  const float decayed = 2.0f, expected_S = decayed + 0.25f * (2.0f - decayed);
  EXPECT_FLOAT_EQ(S, expected_S);
  EXPECT_FLOAT_EQ(o, expected_S * 0.5f);
}

TEST(DeltaRuleChunked, ChunkSizeDoesNotChangeTheResult) {
  Inputs in = make_inputs(130, 7);
  const auto& d = in.d;
  std::vector<float> s64 = in.state, s16 = in.state;
  std::vector<float> o64(size_t(in.T) * d.Hv * d.dv), o16(o64.size());
  cpu::delta_rule_chunked(d, in.T, in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), s64.data(),
                          o64.data(), 64);
  cpu::delta_rule_chunked(d, in.T, in.q.data(), in.k.data(), in.v.data(), in.beta.data(), in.g.data(), s16.data(),
                          o16.data(), 16);
  EXPECT_LT(rel_err(o16, o64), 1e-5);
  EXPECT_LT(rel_err(s16, s64), 1e-5);
}

}  // namespace
}  // namespace petrel
