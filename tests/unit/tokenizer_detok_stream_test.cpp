// The streaming detokenizer reproduces decode() piece by piece and never emits broken UTF-8.
#include <gtest/gtest.h>

#include <random>

#include "generate/detok_stream.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace petrel {
namespace {

// Streams `ids` one at a time; checks each piece is valid UTF-8 and the whole equals decode().
void expect_stream_matches(const std::vector<uint32_t>& ids, bool skip_special, const std::string& label) {
  const Tokenizer& tok = test::qwen3();
  DetokStream stream(tok, skip_special);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = stream.push(ids[i]);
    ASSERT_TRUE(utf8::is_valid(piece)) << label << ": invalid UTF-8 after token " << i;
    streamed += piece;
  }
  const std::string tail = stream.finish();
  ASSERT_TRUE(utf8::is_valid(tail)) << label;
  streamed += tail;
  EXPECT_EQ(streamed, tok.decode(ids, skip_special)) << label;
  EXPECT_EQ(stream.pending_bytes(), 0u);
}

TEST(TokenizerDetokStream, CorpusStreamsToFullDecode) {
  PETREL_REQUIRE_QWEN3();
  const auto corpus = test::read_json(test::tokenizer_fixtures() / "corpus.json");
  for (const auto& [name, text] : corpus.items()) {
    const auto ids = test::qwen3().encode(text.get<std::string>());
    expect_stream_matches(ids, false, name);
    expect_stream_matches(ids, true, name + "/skip_special");
  }
}

TEST(TokenizerDetokStream, BrokenSequencesMatchDecode) {
  PETREL_REQUIRE_QWEN3();
  // Reference decodes of slices and reversals that cut characters apart (U+FFFD expected).
  const auto cases = test::read_json(test::tokenizer_fixtures() / "decode_goldens.json");
  for (const auto& c : cases) expect_stream_matches(c["ids"].get<std::vector<uint32_t>>(), false, c["name"]);
}

TEST(TokenizerDetokStream, RandomTokenSequences) {
  PETREL_REQUIRE_QWEN3();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_id(0, 151642);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint32_t> ids(1 + rng() % 40);
    for (auto& id : ids) id = any_id(rng);
    expect_stream_matches(ids, false, "random trial " + std::to_string(trial));
  }
}

TEST(TokenizerDetokStream, HoldsBackIncompleteCharacter) {
  PETREL_REQUIRE_QWEN3();
  const Tokenizer& tok = test::qwen3();
  // "😀" is one 4-byte character, fed here as four single-byte tokens.
  const std::string emoji = "\xF0\x9F\x98\x80";
  DetokStream stream(tok);
  std::string out;
  for (size_t i = 0; i < emoji.size(); ++i) {
    uint32_t byte_token = 0;
    for (uint32_t cand = 0; cand < 256; ++cand)
      if (tok.token_bytes(cand) == emoji.substr(i, 1)) byte_token = cand;
    out += stream.push(byte_token);
    if (i + 1 < emoji.size()) EXPECT_EQ(out, "") << "emitted a partial character after byte " << i;
  }
  EXPECT_EQ(out, emoji);
}

}  // namespace
}  // namespace petrel
