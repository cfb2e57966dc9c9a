// Model::forward_batch on the CPU: a row's logits do not depend on which other sequences share the
// step. On every fixture model, sequences with different prompt lengths that join and leave the
// batch between steps get, bit for bit, the logits of decoding each one alone. Also: a reset state
// computes what a fresh one does, and a prompt piece carried by a decode step leaves every row as
// it is without the piece.
#include <gtest/gtest.h>

#include "../unit/checkpoint_logits.h"
#include "batch_schedule.h"
#include "core/error.h"
#include "cpu_fixture.h"
#include "runtime/scheduler.h"

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

// A model that keeps 4 logits rows a step: every-position logits of a longer prompt come in pieces
// of 4 (equal to one-piece logits within float noise), and a step that would keep more rows, or a
// scheduler with more sequences, is refused naming the option.
TEST(BatchedDecodeErrors, LogitRowsBoundWhatAStepKeeps) {
  test::CpuFixture small("qwen3-dense-f32", /*max_chunk=*/64, /*logit_rows=*/4), whole("qwen3-dense-f32", 64);
  ASSERT_EQ(small.model->logit_rows(), 4);
  const std::vector<int32_t> prompt = test::schedule_prompt(1, small.vocab());  // 20 tokens
  std::vector<float> pieces(prompt.size() * size_t(small.vocab())), one(pieces.size());
  auto a = small.model->new_sequence(64), b = whole.model->new_sequence(64);
  small.model->forward(prompt.data(), int(prompt.size()), *a, nullptr, pieces.data());
  whole.model->forward(prompt.data(), int(prompt.size()), *b, nullptr, one.data());
  test::expect_logits_within(one, pieces, 1e-5f);

  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<SequenceState*> rows;
  std::vector<int32_t> ids(5, 1);
  for (int i = 0; i < 5; ++i) {
    seqs.push_back(small.model->new_sequence(8));
    rows.push_back(seqs.back().get());
  }
  std::vector<float> logits(5 * size_t(small.vocab()));
  try {
    small.model->forward_batch(ids.data(), rows.data(), 5, logits.data());
    FAIL() << "a step of 5 rows was accepted with 4 logits rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ForwardOptions::logit_rows"), std::string::npos) << e.what();
  }
  SchedulerOptions so;
  so.max_sequences = 5;
  try {
    Scheduler scheduler(*small.model, so);
    FAIL() << "a scheduler of 5 sequences was accepted with 4 logits rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logits rows"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchedDecode, ::testing::ValuesIn(test::kFixtureModels),
                         [](const auto& info) { return test::param_name(info.param); });

}  // namespace
}  // namespace petrel
