// The device sampler against the CPU Sampler: on the same logits and the same seed it picks the same
// token at (nearly) every position, its draws follow Sampler::distribution(), seeds reproduce, and
// whole generations with DeviceDecoder equal HostDecoder's. Skipped, with a message, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "../unit/test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "generate/device_decoder.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"
#include "generate/make_decoder.h"
#include "generate/sampler.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel {
namespace {

constexpr int kRealVocab = 248320;  // Qwen3.5's vocabulary
constexpr int kPositions = 2000;

std::unique_ptr<Backend> gpu_backend() {
  CudaOptions o;
  o.progress = false;
  return make_cuda_backend(o);
}

// Logits shaped like a language model's: a broad normal bulk plus a head of `head` likely tokens
// (raised by 6..14), so temperature, top-k, top-p and min-p all cut somewhere inside the head or
// the bulk. With `tie`, tokens 3 and 7 share the largest logit (greedy and top-k 1 must take 3).
std::vector<float> random_logits(int vocab, int head, uint32_t seed, bool tie = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& x : l) x = bulk(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  for (int j = 0; j < head; ++j) l[size_t(id(rng))] += 6.0f + 8.0f * float(j) / float(head);
  if (tie) {
    const float top = *std::max_element(l.begin(), l.end()) + 1.0f;
    l[3] = l[7] = top;
  }
  return l;
}

struct LogitsCase {
  std::string name;
  std::vector<float> logits;
};

std::vector<LogitsCase> logits_cases() {
  return {{"real-vocab peaked", random_logits(kRealVocab, 40, 1)},
          {"real-vocab broad", random_logits(kRealVocab, 400, 2)},
          {"small vocab with a tie", random_logits(1000, 30, 3, /*tie=*/true)}};
}

// Tokens the penalty history is made of: likely ones (so the penalties move the outcome), repeated.
std::vector<int32_t> likely_tokens(const std::vector<float>& logits, int n) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ids.resize(size_t(n));
  return ids;
}

struct FilterCase {
  std::string name;
  SamplingParams params;
  bool history = false;  // observe a prompt and generated tokens first
};

// Penalties over a window that some history tokens have left, a ban and a boost, on top of `p`.
SamplingParams penalised(SamplingParams p, const std::vector<int32_t>& likely) {
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.25f;
  p.penalty_last_n = 50;
  p.logit_bias = {{likely[0], -INFINITY}, {likely[5], 3.0f}, {likely[9], -1.5f}};
  return p;
}

std::vector<FilterCase> filter_cases(const std::vector<float>& logits) {
  const std::vector<int32_t> likely = likely_tokens(logits, 12);
  const int beyond = int(logits.size()) + 5;
  return {
      {"greedy", {.temperature = 0.0f, .seed = 42}},
      {"temperature", {.temperature = 0.8f, .seed = 42}},
      {"top-k", {.top_k = 20, .seed = 42}},
      {"top-k 1", {.top_k = 1, .seed = 42}},
      {"top-k above the vocabulary", {.top_k = beyond, .seed = 42}},
      {"top-p", {.top_p = 0.8f, .seed = 42}},
      // A cut deep in the bulk (tens of thousands of tokens kept on the real vocabulary): the
      // selection must resolve keys that share their high digits. Too spread for the total
      // variation of 2000 draws to say much; the token-for-token check carries this case.
      {"wide top-p", {.temperature = 1.5f, .top_p = 0.9f, .seed = 42}},
      {"min-p", {.min_p = 0.05f, .seed = 42}},
      {"all filters", {.temperature = 0.7f, .top_k = 30, .top_p = 0.9f, .min_p = 0.02f, .seed = 42}},
      {"penalties and bias", penalised({.temperature = 0.9f, .seed = 42}, likely), true},
      {"penalties and bias, greedy", penalised({.temperature = 0.0f, .seed = 42}, likely), true},
      {"penalties, bias and all filters",
       penalised({.temperature = 1.1f, .top_k = 8, .top_p = 0.85f, .min_p = 0.01f, .seed = 42}, likely), true},
      // 1/T overflows a float: greedy on both samplers.
      {"temperature below 1/FLT_MAX", {.temperature = 1e-39f, .seed = 42}},
      // Likely tokens divided by 1e-38 overflow to +inf: they share the whole probability.
      {"infinite logits", {.temperature = 1.0f, .repetition_penalty = 1e-38f, .seed = 42}, true},
  };
}

// 60 prompt tokens then 60 generated ones, all from the likely set with repeats; with a window of
// 50 the early ones have left it again (and their counts must drop).
template <class S>
void observe_history(S& s, const std::vector<float>& logits) {
  const std::vector<int32_t> likely = likely_tokens(logits, 12);
  for (int i = 0; i < 120; ++i) s.observe(likely[size_t((i * 7 + i / 5) % 12)], i >= 60);
}

// Upper bound on the total variation between the empirical distribution of n independent draws
// and p, exceeded with probability < 1e-4: E|p̂_i - p_i| <= min(sqrt(p_i / n), 2 p_i), and the TV
// changes by at most 1/n per draw, so by McDiarmid P(TV > E[TV] + t) <= exp(-2 n t²) = 4.5e-5 at
// t = 0.05, n = 2000. The logits put most mass on a few dozen tokens, so the bound stays well
// below what a wrong cut or a wrong weight would give.
double tv_bound(const std::vector<double>& p, int n) {
  double expected = 0.0;
  for (double pi : p) expected += std::min(std::sqrt(pi / n), 2.0 * pi);
  return 0.5 * expected + 0.05;
}

// The CPU Sampler's tokens for positions 0 .. n-1, on several threads: on a 248k-token row one
// sample costs milliseconds on the CPU (a hundred with a wide top-p set).
std::vector<int32_t> cpu_tokens(const FilterCase& fc, const std::vector<float>& logits, int n) {
  const int threads = int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<int32_t> tokens(size_t(n), -1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Sampler cpu(fc.params, int(logits.size()));
      if (fc.history) observe_history(cpu, logits);
      for (int pos = t; pos < n; pos += threads) tokens[size_t(pos)] = cpu.sample(logits.data(), uint64_t(pos));
    });
  }
  for (std::thread& t : pool) t.join();
  return tokens;
}

TEST(CudaSampler, MatchesCpuSamplerTokenForToken) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  auto backend = gpu_backend();
  for (const LogitsCase& lc : logits_cases()) {
    const int V = int(lc.logits.size());
    Tensor row = backend->alloc(1, V, /*fp32=*/true);
    backend->from_host(lc.logits.data(), row);
    auto device = backend->make_sampler(V);
    ASSERT_NE(device, nullptr);
    for (const FilterCase& fc : filter_cases(lc.logits)) {
      SCOPED_TRACE(lc.name + ", " + fc.name);
      const std::vector<int32_t> want = cpu_tokens(fc, lc.logits, kPositions);
      device->reset(fc.params);
      if (fc.history) observe_history(*device, lc.logits);
      std::vector<int> counts(size_t(V), 0);
      int agree = 0;
      for (int pos = 0; pos < kPositions; ++pos) {
        const int32_t got = device->sample(row, uint64_t(pos));
        ASSERT_GE(got, 0);
        ASSERT_LT(got, V);
        agree += got == want[size_t(pos)];
        ++counts[size_t(got)];
      }
      // Only a draw within rounding of a CDF boundary may differ (double sums in another order).
      EXPECT_GE(agree, kPositions * 99 / 100) << "positions where the device and the CPU agree";
      Sampler cpu(fc.params, V);
      if (fc.history) observe_history(cpu, lc.logits);
      const std::vector<double> p = cpu.distribution(lc.logits.data());
      double tv = 0.0;
      for (int t = 0; t < V; ++t) tv += 0.5 * std::fabs(counts[size_t(t)] / double(kPositions) - p[size_t(t)]);
      const double bound = tv_bound(p, kPositions);
      std::printf("note: %s, %s: %d of %d tokens as on the CPU, total variation %.4f (bound %.4f)\n", lc.name.c_str(),
                  fc.name.c_str(), agree, kPositions, tv, bound);
      EXPECT_LE(tv, bound) << "total variation between the device's draws and the CPU distribution";
      for (int t = 0; t < V; ++t)
        EXPECT_TRUE(p[size_t(t)] > 0.0 || counts[size_t(t)] == 0) << "token " << t << " has probability 0";
    }
  }
}

TEST(CudaSampler, SameSeedSameTokensOtherSeedOthers) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  auto backend = gpu_backend();
  const std::vector<float> logits = random_logits(kRealVocab, 400, 7);
  Tensor row = backend->alloc(1, kRealVocab, /*fp32=*/true);
  backend->from_host(logits.data(), row);
  auto device = backend->make_sampler(kRealVocab);
  auto run = [&](uint64_t seed) {
    device->reset({.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .seed = seed});
    std::vector<int32_t> tokens;
    for (int pos = 0; pos < 500; ++pos) tokens.push_back(device->sample(row, uint64_t(pos)));
    return tokens;
  };
  const std::vector<int32_t> a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(a, b);
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != c[i];
  EXPECT_GE(differ, 100) << "positions where seeds 7 and 8 draw different tokens";
}

TEST(CudaSampler, EveryTokenBannedIsAnError) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  auto backend = gpu_backend();
  const int V = 1000;
  const std::vector<float> logits = random_logits(V, 10, 9);
  Tensor row = backend->alloc(1, V, /*fp32=*/true);
  backend->from_host(logits.data(), row);
  auto device = backend->make_sampler(V);
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p{.temperature = temperature};
    for (int t = 0; t < V; ++t) p.logit_bias[t] = -INFINITY;
    Sampler cpu(p, V);
    device->reset(p);
    if (temperature == 0.0f) {  // the argmax of all -inf: the lowest id, as on the CPU
      EXPECT_EQ(device->sample(row, 0), cpu.sample(logits.data(), 0));
    } else {
      EXPECT_THROW(cpu.sample(logits.data(), 0), Error);
      EXPECT_THROW(device->sample(row, 0), Error);
    }
  }
}

// One sampler per filter case, each on its own logits row, all started before the first is
// finished (one launch set for every row, as a batched decode step samples): each row's tokens
// equal that sampler's tokens drawn alone, so no row reads another's logits, parameters or
// scratch. A sampler reset between start and finish drops its queued draw from the batch.
TEST(CudaSampler, RowsDrawnTogetherEqualRowsDrawnAlone) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  auto backend = gpu_backend();
  const std::vector<float> shape = random_logits(kRealVocab, 40, 11);
  const std::vector<FilterCase> cases = filter_cases(shape);
  const int R = int(cases.size());
  Tensor rows = backend->alloc(R, kRealVocab, /*fp32=*/true);
  std::vector<float> all;
  for (int r = 0; r < R; ++r) {
    const std::vector<float> l = random_logits(kRealVocab, 30 + 20 * r, 100 + uint32_t(r));
    all.insert(all.end(), l.begin(), l.end());
  }
  backend->from_host(all.data(), rows);
  std::vector<std::unique_ptr<DeviceSampler>> together, alone;
  for (int r = 0; r < R; ++r) {
    together.push_back(backend->make_sampler(kRealVocab));
    alone.push_back(backend->make_sampler(kRealVocab));
    for (auto* s : {together.back().get(), alone.back().get()}) {
      s->reset(cases[size_t(r)].params);
      if (cases[size_t(r)].history)
        observe_history(*s, std::vector<float>(all.begin() + ptrdiff_t(r) * kRealVocab,
                                               all.begin() + ptrdiff_t(r + 1) * kRealVocab));
    }
  }
  auto bystander = backend->make_sampler(kRealVocab);
  constexpr int kSteps = 40;
  int differ_from_row0 = 0;
  for (int pos = 0; pos < kSteps; ++pos) {
    bystander->reset({.temperature = 0.0f});
    bystander->start(rows.rows_view(0, 1), uint64_t(pos));
    for (int r = 0; r < R; ++r) together[size_t(r)]->start(rows.rows_view(r, 1), uint64_t(pos));
    bystander->reset({.temperature = 0.0f});  // its queued draw must not run into the others'
    std::vector<int32_t> got(static_cast<size_t>(R));
    for (int r = R - 1; r >= 0; --r) got[size_t(r)] = together[size_t(r)]->finish();
    for (int r = 0; r < R; ++r) {
      SCOPED_TRACE(cases[size_t(r)].name + ", position " + std::to_string(pos));
      const int32_t want = alone[size_t(r)]->sample(rows.rows_view(r, 1), uint64_t(pos));
      EXPECT_EQ(got[size_t(r)], want);
      differ_from_row0 += got[size_t(r)] != got[0];
    }
    // Draws advance each sampler's penalty history as the scheduler does.
    for (int r = 0; r < R; ++r) {
      together[size_t(r)]->observe(got[size_t(r)], true);
      alone[size_t(r)]->observe(got[size_t(r)], true);
    }
  }
  EXPECT_GT(differ_from_row0, kSteps * R / 2) << "rows with their own logits draw their own tokens";
}

// A structured output's mask: the device draws only allowed tokens, and the same ones as the CPU
// Sampler with the same mask, after penalties and a bias that boosts a masked-out token. A mask
// that allows nothing is an error, as on the CPU.
TEST(CudaSampler, DrawsOnlyWhatTheMaskAllows) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  auto backend = gpu_backend();
  const std::vector<float> logits = random_logits(kRealVocab, 400, 21);
  Tensor row = backend->alloc(1, kRealVocab, /*fp32=*/true);
  backend->from_host(logits.data(), row);
  const std::vector<int32_t> likely = likely_tokens(logits, 12);
  std::vector<uint32_t> mask(size_t(kRealVocab + 31) / 32, 0);
  std::mt19937 rng(5);
  for (int t = 0; t < kRealVocab; ++t)
    if (rng() % 50 == 0) mask[size_t(t) / 32] |= 1u << (t % 32);
  for (int k = 0; k < 12; k += 2) mask[size_t(likely[size_t(k)]) / 32] |= 1u << (likely[size_t(k)] % 32);
  for (int k = 1; k < 12; k += 2) mask[size_t(likely[size_t(k)]) / 32] &= ~(1u << (likely[size_t(k)] % 32));
  const auto allowed = [&](int32_t t) { return (mask[size_t(t) / 32] >> (t % 32)) & 1u; };
  auto device = backend->make_sampler(kRealVocab);
  for (const FilterCase& fc : filter_cases(logits)) {
    SCOPED_TRACE(fc.name);
    SamplingParams p = fc.params;
    p.logit_bias[likely[5]] = 30.0f;  // masked out: stays out whatever the bias
    Sampler cpu(p, kRealVocab);
    cpu.set_mask(mask.data());
    device->reset(p);
    if (fc.history) {
      observe_history(cpu, logits);
      observe_history(*device, logits);
    }
    constexpr int kDraws = 200;
    int agree = 0;
    for (int pos = 0; pos < kDraws; ++pos) {
      device->set_mask(mask.data());
      const int32_t got = device->sample(row, uint64_t(pos));
      ASSERT_TRUE(got >= 0 && got < kRealVocab && allowed(got)) << "token " << got << " at position " << pos;
      agree += got == cpu.sample(logits.data(), uint64_t(pos));
    }
    EXPECT_GE(agree, kDraws * 98 / 100) << "draws equal to the CPU Sampler's";
  }
  std::vector<uint32_t> none(mask.size(), 0);
  for (float temperature : {0.0f, 1.0f}) {
    device->reset({.temperature = temperature});
    device->set_mask(none.data());
    EXPECT_THROW(device->sample(row, 0), Error) << "temperature " << temperature;
  }
  device->reset({.temperature = 0.0f});  // reset lifts the mask
  EXPECT_EQ(device->sample(row, 0), likely[0]);
}

// ---- whole generations on a model ----------------------------------------------------------------

struct GpuModel {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  explicit GpuModel(const std::string& dir) : ck(Checkpoint::open(dir)), backend(gpu_backend()) {
    model = std::make_unique<Model>(ck->config(), ck->weights(), *backend);
  }
};

std::vector<int32_t> generate(Decoder& decoder, const std::vector<int32_t>& prompt, const SamplingParams& p,
                              int draft) {
  constexpr int kTokens = 96;
  Generator generator(decoder);
  auto st = decoder.new_sequence(int(prompt.size()) + kTokens + 1);
  GenerateRequest req;
  req.tokens = prompt;
  req.sampling = p;
  req.max_tokens = kTokens;  // no EOS ids: always kTokens tokens
  req.speculative.draft = draft;
  req.speculative.ngram_min = 1;
  return generator.generate(st, req, [](int32_t) { return true; }).tokens;
}

std::vector<int32_t> reference_prompt(const std::string& dir) {
  const auto j = nlohmann::json::parse(std::ifstream(dir + "/reference.json"));
  return j["prompt_ids"].get<std::vector<int32_t>>();
}

class CudaSamplerModel : public ::testing::TestWithParam<std::string> {};

// Both decoders read the same GPU model's logits (HostDecoder copies them to the host), so any
// difference comes from the samplers.
TEST_P(CudaSamplerModel, DeviceDecoderGeneratesWhatHostDecoderDoes) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  const std::string dir = GetParam() == "petrel-tiny" ? test::tiny_model_dir() : test::fixture_model(GetParam());
  GpuModel m(dir);
  const std::vector<int32_t> prompt =
      GetParam() == "petrel-tiny" ? std::vector<int32_t>{5, 17, 42, 99, 7, 63, 120, 33} : reference_prompt(dir);
  std::unique_ptr<Decoder> device = make_decoder(*m.model);
  ASSERT_NE(dynamic_cast<DeviceDecoder*>(device.get()), nullptr) << "make_decoder on CUDA";
  HostDecoder host(*m.model);

  const SamplingParams greedy{.temperature = 0.0f};
  const SamplingParams seeded{.temperature = 0.9f,
                              .top_k = 40,
                              .top_p = 0.95f,
                              .min_p = 0.01f,
                              .repetition_penalty = 1.1f,
                              .presence_penalty = 0.3f,
                              .frequency_penalty = 0.1f,
                              .penalty_last_n = 32,
                              .seed = 5};
  for (int draft : {0, 4}) {  // with a draft, rows of a multi-token verify are sampled (KeepLogits::All)
    SCOPED_TRACE("draft " + std::to_string(draft));
    EXPECT_EQ(generate(*device, prompt, greedy, draft), generate(host, prompt, greedy, draft));
    const std::vector<int32_t> a = generate(*device, prompt, seeded, draft), b = generate(host, prompt, seeded, draft);
    ASSERT_EQ(a.size(), b.size());
    int same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
    std::printf("note: %s draft %d: %d of %zu sampled tokens as with HostDecoder\n", GetParam().c_str(), draft, same,
                a.size());
    EXPECT_GE(same * 100, int(a.size()) * 95) << "tokens equal to HostDecoder's";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaSamplerModel,
                         ::testing::Values("petrel-tiny", "qwen35moe-text-per-expert", "qwen3next-sharded"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace petrel
