// Stop strings are found across token boundaries and never shown; think tags split reasoning
// from the answer; what is shown concatenates to the decoded text.
#include <gtest/gtest.h>

#include "core/error.h"
#include "generate/stop.h"
#include "generate/text_output.h"
#include "tokenizer_test_util.h"

namespace petrel {
namespace {

std::string feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string shown;
  for (const auto& p : pieces) shown += m.push(p);
  return shown + m.finish();
}

TEST(StopMatcher, FindsAStopStringSplitAcrossPiecesAndShowsNothingOfIt) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("abc E"), "abc ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("Dxyz"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(*m.matched(), "END");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, ReleasesAHeldPrefixOnceItCannotMatch) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("a EN"), "a ");
  EXPECT_EQ(m.push("d"), "ENd");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("E"), "");
  EXPECT_EQ(m.finish(), "E") << "the answer ended: nothing can complete the match any more";
}

TEST(StopMatcher, EarliestOfSeveralStopStringsWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(feed(m, {"hel", "lo", " wor", "ld"}), "hel");
  EXPECT_EQ(*m.matched(), "lo w");
}

TEST(StopMatcher, OverlappingPrefixesAndMultiByteStops) {
  StopMatcher a({"aab"});
  EXPECT_EQ(feed(a, {"a", "a", "a", "b", "c"}), "a");
  StopMatcher b({"😀!"});
  EXPECT_EQ(feed(b, {"ok ", "😀", "?", "😀", "!"}), "ok 😀?");
  StopMatcher none({"\n\n"});
  EXPECT_EQ(feed(none, {"one\n", "two\n", "three"}), "one\ntwo\nthree");
}

TEST(StopMatcher, RejectsAnEmptyStopString) { EXPECT_THROW(StopMatcher({"x", ""}), Error); }

struct Shown {
  std::string thinking, answer;
};

// Pushes the ids of `text` one by one through a TextOutput.
Shown show(const Tokenizer& tok, const std::string& text, std::vector<std::string> stops,
           std::span<const int32_t> prompt = {}, std::string* transcript = nullptr) {
  Shown s;
  TextOutput out(tok, ThinkFilter(tok, prompt), std::move(stops), [&](Channel c, std::string_view piece) {
    (c == Channel::Thinking ? s.thinking : s.answer) += piece;
  });
  for (uint32_t id : tok.encode(text))
    if (!out.push(int32_t(id))) break;
  out.finish();
  if (transcript) *transcript = out.transcript();
  return s;
}

TEST(TextOutput, StopStringsSplitAcrossTokensAreFoundAndNotShown) {
  PETREL_REQUIRE_QWEN3();
  const Tokenizer& tok = test::qwen3();
  const std::string text = "The answer is forty-two. Observation: the user asked again.";
  // "Observation:" is several tokens (" Observation", ":"), as is "two. Obs".
  ASSERT_GT(tok.encode(" Observation:").size(), 1u);
  EXPECT_EQ(show(tok, text, {"Observation:"}).answer, "The answer is forty-two. ");
  EXPECT_EQ(show(tok, text, {"two. Obs"}).answer, "The answer is forty-");
  EXPECT_EQ(show(tok, text, {"rty-tw", "answer"}).answer, "The ");
  EXPECT_EQ(show(tok, text, {"not there"}).answer, text);
}

TEST(TextOutput, MultiByteCharactersSplitAcrossTokensComeOutWhole) {
  PETREL_REQUIRE_QWEN3();
  const Tokenizer& tok = test::qwen3();
  const std::string text = "Emoji 😀😃 and 中文字符 end";
  std::vector<std::string> pieces;
  TextOutput out(tok, ThinkFilter(), {"字符"}, [&](Channel, std::string_view p) { pieces.emplace_back(p); });
  for (uint32_t id : tok.encode(text)) out.push(int32_t(id));
  out.finish();
  std::string joined;
  for (const auto& p : pieces) {
    EXPECT_EQ(tok.decode(tok.encode(p)), p) << "a shown piece is not whole UTF-8";
    joined += p;
  }
  EXPECT_EQ(joined, "Emoji 😀😃 and 中文");
}

TEST(TextOutput, ThinkTagsSplitReasoningFromTheAnswer) {
  PETREL_REQUIRE_QWEN3();
  const Tokenizer& tok = test::qwen3();
  std::string transcript;
  // Qwen3: the model opens the block itself.
  Shown a = show(tok, "<think>\nLet me add.\n</think>\n\nIt is 4. STOP here", {"STOP"}, {}, &transcript);
  EXPECT_EQ(a.thinking, "Let me add.\n");
  EXPECT_EQ(a.answer, "It is 4. ");
  EXPECT_EQ(transcript, "<think>\nLet me add.\n</think>\n\nIt is 4. ");
  // Qwen3.5: the prompt already opened it; stop strings never act on reasoning.
  std::vector<int32_t> prompt;
  for (uint32_t id : tok.encode("<|im_start|>assistant\n<think>\n")) prompt.push_back(int32_t(id));
  Shown b = show(tok, "STOP is only a word here.\n</think>\n\nDone.", {"STOP"}, prompt, &transcript);
  EXPECT_EQ(b.thinking, "STOP is only a word here.\n");
  EXPECT_EQ(b.answer, "Done.");
  EXPECT_EQ(transcript, "STOP is only a word here.\n</think>\n\nDone.");
  // Thinking switched off in the template: the prompt closes the block.
  prompt.clear();
  for (uint32_t id : tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")) prompt.push_back(int32_t(id));
  EXPECT_EQ(show(tok, "Straight\nto the point.", {}, prompt).answer, "Straight\nto the point.");
}

}  // namespace
}  // namespace petrel
