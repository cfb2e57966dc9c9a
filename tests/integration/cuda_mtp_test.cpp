// The MTP head on the GPU: its logits against the CPU backend's (cosine >= 0.999 per row, as for the
// trunk), and speculative decoding with its drafts on the device decoder against plain decoding of
// the same GPU model, verified and with forced acceptance (whose state must still be the emitted
// sequence). Skipped, with a message, where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "cpu_fixture.h"
#include "cuda_fixture.h"
#include "generate/generator.h"
#include "generate/make_decoder.h"

namespace petrel {
namespace {

std::vector<int32_t> reference_prompt(const std::string& name) {
  const auto j = nlohmann::json::parse(std::ifstream(test::fixture_model(name) + "/reference.json"));
  return j["prompt_ids"].get<std::vector<int32_t>>();
}

double cosine(const float* a, const float* b, int n) {
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// Every row of the head over the prompt's trunk rows, on `model`.
std::vector<float> head_logits(Model& model, const std::vector<int32_t>& ids) {
  const int T = int(ids.size());
  auto st = model.new_sequence(T);
  model.forward(ids.data(), T, *st, nullptr);
  auto mtp = model.new_mtp_sequence(T);
  std::vector<float> logits(size_t(T - 1) * size_t(model.config().vocab));
  model.mtp_forward(ids.data() + 1, T - 1, /*from_trunk=*/true, *mtp, logits.data());
  return logits;
}

class CudaMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaMtp, HeadLogitsAgreeWithCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  test::CudaFixtureModel gpu(GetParam());
  test::CpuFixture cpu(GetParam());
  const std::vector<int32_t> ids = reference_prompt(GetParam());
  const std::vector<float> g = head_logits(*gpu.model, ids), c = head_logits(*cpu.model, ids);
  const int V = cpu.vocab(), rows = int(ids.size()) - 1;
  std::vector<double> cosines;
  for (int t = 0; t < rows; ++t) cosines.push_back(cosine(&g[size_t(t) * V], &c[size_t(t) * V], V));
  // The head reads the trunk's last hidden rows, so it inherits the trunk's bf16 noise at the
  // fixtures' ill-conditioned positions (qwen3next-mtp: 0.895 at row 47, where the trunk itself
  // drops; H100, 0a57dce): the bounds of the trunk's fixture test (cuda_model_test.cpp).
  const int below = int(std::count_if(cosines.begin(), cosines.end(), [](double x) { return x < 0.999; }));
  std::sort(cosines.begin(), cosines.end());
  std::printf("note: %s head cosine min %.6f, median %.6f, %d of %d rows below 0.999\n", GetParam().c_str(),
              cosines[0], cosines[cosines.size() / 2], below, rows);
  EXPECT_GE(cosines[cosines.size() / 2], 0.9995);
  EXPECT_LE(below, rows * 15 / 100);
  EXPECT_GE(cosines[0], 0.8);
}

GenerateResult generate(Decoder& decoder, const std::vector<int32_t>& prompt, int draft,
                        std::optional<double> forced, std::unique_ptr<SequenceState>* state = nullptr) {
  constexpr int kTokens = 64;
  Generator generator(decoder);
  auto st = decoder.new_sequence(int(prompt.size()) + kTokens + 1);
  GenerateRequest req;
  req.tokens = prompt;
  req.sampling.temperature = 0.0f;
  req.sampling.repetition_penalty = 0.3f;  // the model loops, so drafts are sometimes right
  req.max_tokens = kTokens;
  req.speculative.draft = draft;
  req.speculative.source = DraftSource::Mtp;
  req.speculative.forced_acceptance = forced;
  GenerateResult r = generator.generate(st, req, [](int32_t) { return true; });
  if (state) *state = std::move(st);
  return r;
}

// The verify rows come from a multi-token forward, the plain ones from the one-token step: bf16
// rounding may part them at a near tie, so the count of equal tokens is reported and bounded.
TEST_P(CudaMtp, SpeculativeGreedyFollowsPlainGreedy) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  test::CudaFixtureModel gpu(GetParam());
  const auto decoder = make_decoder(*gpu.model);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), {5, 200, 17, 93, 41});
  const std::vector<int32_t> plain = generate(*decoder, prompt, 0, std::nullopt).tokens;
  for (int k = 1; k <= 3; ++k) {
    const GenerateResult spec = generate(*decoder, prompt, k, std::nullopt);
    size_t same = 0;
    while (same < plain.size() && same < spec.tokens.size() && plain[same] == spec.tokens[same]) ++same;
    std::printf("note: %s draft %d: first %zu of %zu tokens as plain, drafts %d/%d accepted\n", GetParam().c_str(),
                k, same, plain.size(), spec.stats.accepted, spec.stats.drafted);
    EXPECT_GE(same, plain.size() / 2) << "draft " << k;
    EXPECT_GT(spec.stats.verify_steps, 0);
  }
}

// Forced acceptance (bench --draft-accept-rate): afterwards the state is the emitted sequence, so
// the next step's logits equal those of a fresh state fed the same tokens.
TEST_P(CudaMtp, ForcedAcceptanceLeavesTheEmittedSequence) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  test::CudaFixtureModel gpu(GetParam());
  const auto decoder = make_decoder(*gpu.model);
  const std::vector<int32_t> prompt = reference_prompt(GetParam());
  std::unique_ptr<SequenceState> st;
  const GenerateResult r = generate(*decoder, prompt, 2, 0.7, &st);
  ASSERT_GT(r.stats.accepted, 0);
  std::vector<int32_t> fed = prompt;
  fed.insert(fed.end(), r.tokens.begin(), r.tokens.end() - 1);
  ASSERT_EQ(st->n_past, int(fed.size()));
  auto ref = gpu.model->new_sequence(int(fed.size()) + 1);
  gpu.model->forward(fed.data(), int(fed.size()), *ref, nullptr);
  const int V = gpu.vocab();
  std::vector<float> want(static_cast<size_t>(V)), got(static_cast<size_t>(V));
  gpu.model->forward(&r.tokens.back(), 1, *ref, want.data());
  gpu.model->forward(&r.tokens.back(), 1, *st, got.data());
  EXPECT_GE(cosine(got.data(), want.data(), V), 0.999);
}

// Verify steps (every row's logits of a few tokens) and the head's steps run directly the first
// time and are recorded as CUDA graphs the second: each replay gives the bits that a backend
// without graphs computes from the same inputs, at positions that move on. 3 rows take the GEMV
// kernels, 6 the rows kernel. Steps alternate with drafted ones (KeepLogits::Drafted, what
// speculative decoding feeds: DeltaNet a row at a time) on the same sequence, whose recordings
// must stay apart from the others of as many rows.
TEST_P(CudaMtp, RecordedVerifyAndHeadStepsEqualDirectRuns) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  test::CudaFixtureModel graphs(GetParam()), direct(GetParam(), /*graphs=*/false);
  const std::vector<int32_t> prompt = reference_prompt(GetParam());
  constexpr int kPrefix = 60, kSteps = 6;
  const int V = graphs.vocab();
  for (int T : {3, 6}) {
    SCOPED_TRACE("rows " + std::to_string(T));
    ASSERT_GE(int(prompt.size()), kPrefix + kSteps * T + 1);
    std::unique_ptr<SequenceState> st[2], mtp[2];
    Model* model[2] = {graphs.model.get(), direct.model.get()};
    for (int m = 0; m < 2; ++m) {
      st[m] = model[m]->new_sequence(kPrefix + kSteps * T);
      mtp[m] = model[m]->new_mtp_sequence(kSteps * (T + 1));
      model[m]->forward(prompt.data(), kPrefix, *st[m], nullptr);
    }
    for (int step = 0; step < kSteps; ++step) {
      const KeepLogits keep = step % 2 ? KeepLogits::Drafted : KeepLogits::All;
      SCOPED_TRACE("step " + std::to_string(step) + (step % 2 ? ", drafted" : ""));
      const int32_t* ids = prompt.data() + kPrefix + step * T;
      std::vector<float> verify[2], head[2], chained[2];
      int32_t drafted[2], chained_draft[2];
      for (int m = 0; m < 2; ++m) {
        verify[m].assign(size_t(T) * size_t(V), NAN);
        head[m].assign(size_t(T) * size_t(V), NAN);
        chained[m].assign(size_t(V), NAN);
        const Tensor rows = model[m]->forward_device(ids, T, *st[m], keep);
        model[m]->backend().to_host(rows, verify[m].data());
        drafted[m] = model[m]->mtp_forward(ids + 1, T, /*from_trunk=*/true, *mtp[m], head[m].data());
        chained_draft[m] = model[m]->mtp_forward(&drafted[m], 1, /*from_trunk=*/false, *mtp[m], chained[m].data());
      }
      EXPECT_EQ(verify[0], verify[1]) << "verify rows";
      EXPECT_EQ(head[0], head[1]) << "head rows from the trunk";
      EXPECT_EQ(chained[0], chained[1]) << "chained head row";
      EXPECT_EQ(drafted[0], drafted[1]);
      EXPECT_EQ(chained_draft[0], chained_draft[1]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaMtp, ::testing::Values("qwen35moe-mtp", "qwen3next-mtp"),
                         [](const auto& info) { return test::param_name(info.param); });

}  // namespace
}  // namespace petrel
