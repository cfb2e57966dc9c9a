// The prompt-lookup drafter: longest recurring suffix n-gram wins, its latest earlier occurrence
// is used, a loop is drafted past the end of the history, and nothing is drafted without a match.
#include <gtest/gtest.h>

#include "core/error.h"
#include "generate/draft_policy.h"
#include "generate/ngram_draft.h"

namespace petrel {
namespace {

NgramDrafter with(const std::vector<int32_t>& tokens, int min_n = 1, int max_n = 3) {
  NgramDrafter d(min_n, max_n);
  for (int32_t t : tokens) d.append(t);
  return d;
}

TEST(NgramDrafter, CopiesWhatFollowedTheLatestEarlierOccurrence) {
  // Suffix "7 8" occurred twice before; the latest (followed by 9 10 11) wins.
  EXPECT_EQ(with({7, 8, 1, 2, 7, 8, 9, 10, 11, 5, 7, 8}).draft(3), (std::vector<int32_t>{9, 10, 11}));
}

TEST(NgramDrafter, LongerMatchesWinOverShorterOnes) {
  // "3" alone last occurred before 4, but "2 3" occurred before 6.
  EXPECT_EQ(with({2, 3, 6, 6, 3, 4, 4, 2, 3}).draft(2), (std::vector<int32_t>{6, 6}));
  EXPECT_EQ(with({2, 3, 6, 6, 3, 4, 4, 2, 3}, 1, 1).draft(2), (std::vector<int32_t>{4, 4}));
}

TEST(NgramDrafter, DraftsALoopBeyondTheEndOfTheHistory) {
  EXPECT_EQ(with({5, 1, 2, 3, 1, 2, 3}).draft(7), (std::vector<int32_t>{1, 2, 3, 1, 2, 3, 1}));
  EXPECT_EQ(with({9, 9, 9}).draft(4), (std::vector<int32_t>{9, 9, 9, 9}));
}

TEST(NgramDrafter, NothingWithoutARecurringNgram) {
  EXPECT_TRUE(with({1, 2, 3, 4, 5}).draft(4).empty());
  EXPECT_TRUE(with({1, 2, 3, 1, 5}, 2, 3).draft(4).empty()) << "1 recurs but 2-grams are the minimum";
  EXPECT_TRUE(with({}).draft(4).empty());
  EXPECT_TRUE(with({1}).draft(4).empty());
}

TEST(NgramDrafter, GrowsIncrementally) {
  NgramDrafter d(2, 2);
  for (int32_t t : {4, 5, 6, 4}) d.append(t);
  EXPECT_TRUE(d.draft(2).empty());
  d.append(5);
  EXPECT_EQ(d.draft(2), (std::vector<int32_t>{6, 4}));
  d.append(9);
  EXPECT_TRUE(d.draft(2).empty());
}

TEST(NgramDrafter, RejectsBadSizes) {
  EXPECT_THROW(NgramDrafter(0, 2), Error);
  EXPECT_THROW(NgramDrafter(3, 2), Error);
}

TEST(DraftPolicy, FollowsAcceptanceAndBacksOffAfterFailures) {
  DraftPolicy p(8);
  EXPECT_EQ(p.length(), 8);
  p.update(8, 3);
  EXPECT_EQ(p.length(), 4) << "one more than was accepted";
  p.update(4, 4);
  EXPECT_EQ(p.length(), 6) << "grows after full acceptance";
  p.update(6, 6);
  p.update(8, 8);
  EXPECT_EQ(p.length(), 8) << "never beyond the maximum";
  p.update(8, 0);
  EXPECT_EQ(p.length(), 0) << "pauses one step after nothing was accepted";
  EXPECT_EQ(p.length(), 1);
  p.update(1, 0);
  EXPECT_EQ(p.length(), 0);
  EXPECT_EQ(p.length(), 0);
  EXPECT_EQ(p.length(), 1) << "the pause doubled";
  p.update(1, 1);
  EXPECT_EQ(p.length(), 3);
  p.update(3, 0);
  EXPECT_EQ(p.length(), 0);
  EXPECT_EQ(p.length(), 1) << "a success reset the back-off";
}

}  // namespace
}  // namespace petrel
