// Model::forward_batch on the GPU against decoding each sequence alone (single-sequence steps,
// CUDA graphs) on the same backend, interleaved: sequences with different prompt lengths join and
// leave the batch between steps. A batch may take other kernels than one row (GEMM instead of
// GEMV), so rows must agree within bf16 noise rather than bit for bit; the greedy token must
// agree wherever the lone run's top-2 margin exceeds that row's difference. Skipped, with a
// message, where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../unit/test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "io/checkpoint.h"
#include "model/forward.h"

namespace petrel {
namespace {

const std::vector<std::string> kFixtures = {"qwen35moe-vlm-fused", "qwen35moe-text-per-expert", "qwen35-dense",
                                            "qwen3next-sharded",   "qwen3moe",                  "qwen3-dense-f32",
                                            "mlx-qwen35moe-4bit",  "mlx-qwen3next-8bit"};
constexpr int kSequences = 5;
constexpr int kSteps = 8;
constexpr int kCapacity = 128;

std::vector<int32_t> prompt_of(int seq, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < 3 + 17 * seq; ++i) p.push_back((i * 31 + seq * 7 + 5) % vocab);
  return p;
}

// Sequence 0 is always in; the others join late, leave early or skip steps.
bool in_step(int seq, int step) {
  switch (seq) {
    case 0: return true;
    case 1: return step >= 2;
    case 2: return step <= 3;
    case 3: return step % 2 == 0;
    default: return step >= 1 && step <= 5;
  }
}

int32_t argmax(const float* row, int n) { return int32_t(std::max_element(row, row + n) - row); }

float top2_margin(std::vector<float> row) {
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
  return row[0] - row[1];
}

struct Gpu {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  explicit Gpu(const std::string& name) : ck(Checkpoint::open(test::fixture_model(name))) {
    CudaOptions o;
    o.progress = false;
    backend = make_cuda_backend(o);
    model = std::make_unique<Model>(ck->config(), ck->weights(), *backend);
  }
};

class CudaBatchedDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaBatchedDecode, RowsAgreeWithDecodingEachSequenceAlone) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  Gpu g(GetParam());
  const int V = g.ck->config().vocab;
  std::vector<std::unique_ptr<SequenceState>> alone, batched;
  std::vector<int32_t> next(kSequences);
  std::vector<float> row(static_cast<size_t>(V));
  for (int s = 0; s < kSequences; ++s) {
    const std::vector<int32_t> p = prompt_of(s, V);
    alone.push_back(g.model->new_sequence(kCapacity));
    batched.push_back(g.model->new_sequence(kCapacity));
    g.model->forward(p.data(), int(p.size()), *alone.back(), row.data());
    g.model->forward(p.data(), int(p.size()), *batched.back(), nullptr);
    next[size_t(s)] = argmax(row.data(), V);
  }
  double worst_cosine = 1.0;
  int identical = 0, rows = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> members;
    for (int s = 0; s < kSequences; ++s)
      if (in_step(s, step)) members.push_back(s);
    std::vector<int32_t> ids;
    std::vector<SequenceState*> states;
    for (int s : members) {
      ids.push_back(next[size_t(s)]);
      states.push_back(batched[size_t(s)].get());
    }
    std::vector<float> logits(members.size() * size_t(V));
    g.model->forward_batch(ids.data(), states.data(), int(members.size()), logits.data());
    for (size_t b = 0; b < members.size(); ++b) {
      const int s = members[b];
      SCOPED_TRACE("step " + std::to_string(step) + ", sequence " + std::to_string(s));
      g.model->forward(&next[size_t(s)], 1, *alone[size_t(s)], row.data());
      const std::vector<float> got(logits.begin() + b * V, logits.begin() + (b + 1) * V);
      const double cosine = test::row_cosines(got, row, 1, V)[0];
      float diff = 0;
      for (int v = 0; v < V; ++v) diff = std::max(diff, std::fabs(got[size_t(v)] - row[size_t(v)]));
      EXPECT_GE(cosine, 0.9995);
      if (top2_margin(row) > diff) {
        EXPECT_EQ(argmax(got.data(), V), argmax(row.data(), V));
      }
      worst_cosine = std::min(worst_cosine, cosine);
      identical += got == row;
      ++rows;
      next[size_t(s)] = argmax(row.data(), V);
    }
  }
  std::printf("note: %s batched vs alone: %d of %d rows bit-identical, lowest cosine %.7f\n", GetParam().c_str(),
              identical, rows, worst_cosine);
}

TEST_P(CudaBatchedDecode, ResetStateComputesWhatAFreshOneDoes) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  Gpu g(GetParam());
  const int V = g.ck->config().vocab;
  const std::vector<int32_t> first = prompt_of(3, V), second = prompt_of(1, V);
  auto used = g.model->new_sequence(kCapacity), fresh = g.model->new_sequence(kCapacity);
  std::vector<float> scratch(static_cast<size_t>(V));
  g.model->forward(first.data(), int(first.size()), *used, scratch.data());
  const int32_t first_next = argmax(scratch.data(), V);
  g.model->forward(&first_next, 1, *used, nullptr);  // records the state's decode graph before the reset
  used->reset();
  std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
  g.model->forward(second.data(), int(second.size()), *used, a.data());
  g.model->forward(second.data(), int(second.size()), *fresh, b.data());
  EXPECT_EQ(a, b) << "same kernels on the same inputs must give identical logits";
  const int32_t t = argmax(a.data(), V);
  g.model->forward(&t, 1, *used, a.data());  // replays the graph recorded before the reset
  g.model->forward(&t, 1, *fresh, b.data());
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaBatchedDecode, ::testing::ValuesIn(kFixtures), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
});

}  // namespace
}  // namespace petrel
