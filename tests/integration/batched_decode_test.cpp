// Model::forward_batch on the CPU: a row's logits do not depend on which other sequences share the
// step. On every fixture model, sequences with different prompt lengths that join and leave the
// batch between steps get, bit for bit, the logits of decoding each one alone. Also: a reset state
// computes what a fresh one does.
#include <gtest/gtest.h>

#include <algorithm>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "model/forward.h"

namespace petrel {
namespace {

const std::vector<std::string> kFixtures = {"qwen35moe-vlm-fused", "qwen35moe-text-per-expert", "qwen35-dense",
                                            "qwen3next-sharded",   "qwen3moe",                  "qwen3-dense-f32",
                                            "mlx-qwen35moe-4bit",  "mlx-qwen3next-8bit"};
constexpr int kSequences = 5;
constexpr int kSteps = 6;
constexpr int kCapacity = 128;

// One thread keeps the test quick on a busy machine; threads split a kernel's outputs, never one
// output's sum, so they cannot change what a row computes.
struct Loaded {
  std::unique_ptr<Checkpoint> ck;
  CpuBackend backend{CpuOptions{1}};
  std::unique_ptr<Model> model;
  explicit Loaded(const std::string& name) : ck(Checkpoint::open(test::fixture_model(name))) {
    model = std::make_unique<Model>(ck->config(), ck->weights(), backend);
  }
  int vocab() const { return ck->config().vocab; }
};

std::vector<int32_t> prompt_of(int seq, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < 3 + 17 * seq; ++i) p.push_back((i * 31 + seq * 7 + 5) % vocab);
  return p;
}

// Whether sequence `seq` takes part in step `step`: 0 always; 1 joins at step 2; 2 leaves after
// step 2; 3 takes every other step; 4 joins at step 1 and leaves after step 4.
bool in_step(int seq, int step) {
  switch (seq) {
    case 0: return true;
    case 1: return step >= 2;
    case 2: return step <= 2;
    case 3: return step % 2 == 0;
    default: return step >= 1 && step <= 4;
  }
}

int32_t argmax(const float* row, int n) { return int32_t(std::max_element(row, row + n) - row); }

class BatchedDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchedDecode, EachRowEqualsDecodingItsSequenceAlone) {
  Loaded m(GetParam());
  const int V = m.vocab();
  std::vector<std::unique_ptr<SequenceState>> alone, batched;
  std::vector<int32_t> next(kSequences);
  std::vector<float> row(static_cast<size_t>(V));
  for (int s = 0; s < kSequences; ++s) {
    const std::vector<int32_t> p = prompt_of(s, V);
    alone.push_back(m.model->new_sequence(kCapacity));
    batched.push_back(m.model->new_sequence(kCapacity));
    m.model->forward(p.data(), int(p.size()), *alone.back(), row.data());
    m.model->forward(p.data(), int(p.size()), *batched.back(), nullptr);
    next[size_t(s)] = argmax(row.data(), V);
  }
  int rows_checked = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int> members;
    for (int s = 0; s < kSequences; ++s)
      if (in_step(s, step)) members.push_back(s);
    if (step % 2 == 1) std::reverse(members.begin(), members.end());  // a row's place must not matter either
    std::vector<int32_t> ids;
    std::vector<SequenceState*> states;
    for (int s : members) {
      ids.push_back(next[size_t(s)]);
      states.push_back(batched[size_t(s)].get());
    }
    std::vector<float> logits(members.size() * size_t(V));
    m.model->forward_batch(ids.data(), states.data(), int(members.size()), logits.data());
    for (size_t b = 0; b < members.size(); ++b) {
      const int s = members[b];
      SCOPED_TRACE("step " + std::to_string(step) + ", sequence " + std::to_string(s) + ", row " + std::to_string(b));
      m.model->forward(&next[size_t(s)], 1, *alone[size_t(s)], row.data());
      const std::vector<float> got(logits.begin() + b * V, logits.begin() + (b + 1) * V);
      ASSERT_EQ(got, row);  // bit for bit
      EXPECT_EQ(batched[size_t(s)]->n_past, alone[size_t(s)]->n_past);
      next[size_t(s)] = argmax(row.data(), V);
      ++rows_checked;
    }
  }
  EXPECT_EQ(rows_checked, 20);
}

TEST_P(BatchedDecode, ResetStateComputesWhatAFreshOneDoes) {
  Loaded m(GetParam());
  const int V = m.vocab();
  const std::vector<int32_t> first = prompt_of(3, V), second = prompt_of(1, V);
  auto used = m.model->new_sequence(kCapacity), fresh = m.model->new_sequence(kCapacity);
  m.model->forward(first.data(), int(first.size()), *used, nullptr);
  used->reset();
  EXPECT_EQ(used->n_past, 0);
  std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
  m.model->forward(second.data(), int(second.size()), *used, a.data());
  m.model->forward(second.data(), int(second.size()), *fresh, b.data());
  EXPECT_EQ(a, b);
  std::vector<float> used_state, fresh_state;
  ASSERT_TRUE(used->dump_state(used_state));
  ASSERT_TRUE(fresh->dump_state(fresh_state));
  EXPECT_EQ(used_state, fresh_state);
}

TEST(BatchedDecodeErrors, RefusesRepeatedOrFullSequences) {
  Loaded m("qwen3-dense-f32");
  auto st = m.model->new_sequence(2);
  const int32_t ids[2] = {1, 2};
  std::vector<float> logits(2 * size_t(m.vocab()));
  SequenceState* twice[2] = {st.get(), st.get()};
  try {
    m.model->forward_batch(ids, twice, 2, logits.data());
    FAIL() << "a sequence given twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the same sequence"), std::string::npos) << e.what();
  }
  m.model->forward(ids, 2, *st, nullptr);
  SequenceState* full[1] = {st.get()};
  try {
    m.model->forward_batch(ids, full, 1, logits.data());
    FAIL() << "a full sequence was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is full"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchedDecode, ::testing::ValuesIn(kFixtures), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
});

}  // namespace
}  // namespace petrel
