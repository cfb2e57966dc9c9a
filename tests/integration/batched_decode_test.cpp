// Model::forward_batch on the CPU: a row's logits do not depend on which other sequences share the
// step. On every fixture model, sequences with different prompt lengths that join and leave the
// batch between steps get, bit for bit, the logits of decoding each one alone. Also: a reset state
// computes what a fresh one does, and a prompt piece carried by a decode step leaves every row as
// it is without the piece.
#include <gtest/gtest.h>

#include "batch_schedule.h"
#include "core/error.h"
#include "cpu_fixture.h"

namespace petrel {
namespace {

class BatchedDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchedDecode, EachRowEqualsDecodingItsSequenceAlone) {
  test::CpuFixture m(GetParam());
  const int rows = test::run_schedule(*m.model, 6, [](const auto& batched, const auto& alone, int step, int seq) {
    ASSERT_EQ(batched, alone) << "step " << step << ", sequence " << seq << ": not bit for bit";
  });
  EXPECT_EQ(rows, 20);
}

TEST_P(BatchedDecode, PromptPiecesInAStepChangeNoRow) {
  test::CpuFixture m(GetParam());
  const int rows = test::run_mixed(*m.model, [](const auto& mixed, const auto& alone, int step, int seq) {
    ASSERT_EQ(mixed, alone) << "step " << step << ", sequence " << seq << ": not bit for bit";
  });
  EXPECT_EQ(rows, 15);
}

TEST_P(BatchedDecode, ResetStateComputesWhatAFreshOneDoes) {
  test::CpuFixture m(GetParam());
  auto used = m.model->new_sequence(test::kScheduleCapacity), fresh = m.model->new_sequence(test::kScheduleCapacity);
  const auto logits = test::reset_versus_fresh(*m.model, *used, *fresh);
  EXPECT_EQ(logits[0], logits[2]) << "after the prompt";
  EXPECT_EQ(logits[1], logits[3]) << "after a decode step";
  std::vector<float> used_state, fresh_state;
  ASSERT_TRUE(used->dump_state(used_state));
  ASSERT_TRUE(fresh->dump_state(fresh_state));
  EXPECT_EQ(used_state, fresh_state);
}

TEST(BatchedDecodeErrors, RefusesRepeatedOrFullSequences) {
  test::CpuFixture m("qwen3-dense-f32");
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

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchedDecode, ::testing::ValuesIn(test::kFixtureModels),
                         [](const auto& info) { return test::param_name(info.param); });

}  // namespace
}  // namespace petrel
