// Unsupported tokenizer.json features and bad input are errors that name what is wrong;
// a tiny hand-made tokenizer pins the BPE merge order.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace petrel {
namespace {

using nlohmann::json;

std::string byte_token(char c) {
  std::string s;
  utf8::append(s, byte_level::byte_to_char(static_cast<uint8_t>(c)));
  return s;
}

// A byte-level BPE tokenizer over the 256 bytes with merges a+a, aa+a, b+c and a special token.
json tiny_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_token(static_cast<char>(b))] = b;
  vocab["aa"] = 256;
  vocab["aaa"] = 257;
  vocab["bc"] = 258;
  return {
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a a", "aa a", "b c"})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"post_processor", nullptr},
      {"added_tokens", json::array({{{"id", 259}, {"content", "<eos>"}, {"special", true}, {"normalized", false}}})},
  };
}

Tokenizer build(const json& doc) { return Tokenizer::from_json_text(doc.dump(), "test tokenizer.json"); }

// Loading `doc` fails with a message containing every one of `needles`.
void expect_load_error(const json& doc, std::initializer_list<const char*> needles) {
  try {
    build(doc);
    ADD_FAILURE() << "loaded without error: " << doc.dump().substr(0, 200);
  } catch (const Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(TokenizerBpe, MergesByRankLeftmostFirst) {
  const Tokenizer tok = build(tiny_tokenizer());
  EXPECT_EQ(tok.encode("aaa"), (std::vector<uint32_t>{257}));
  // a+a (rank 0) applies at both places before aa+a (rank 1) is considered.
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<uint32_t>{256, 256}));
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<uint32_t>{256, 257}));
  EXPECT_EQ(tok.encode("abc"), (std::vector<uint32_t>{'a', 258}));
  EXPECT_EQ(tok.encode("x<eos>aa"), (std::vector<uint32_t>{'x', 259, 256}));
  EXPECT_EQ(tok.decode(tok.encode("x<eos>aa"), true), "xaa");
}

TEST(TokenizerBpe, VeryLongWordIsFastAndExact) {
  PETREL_REQUIRE_QWEN3();
  std::mt19937 rng(5);
  std::string word;
  for (int i = 0; i < 200000; ++i) word += static_cast<char>('a' + rng() % 26);
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = test::qwen3().encode(word);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(test::qwen3().decode(ids), word);
  EXPECT_LT(seconds, 5.0) << "a 200k-byte word took " << seconds << " s: merging is not near-linear";
}

TEST(TokenizerErrors, UnsupportedFeaturesAreNamed) {
  auto with = [](const json::json_pointer& at, json value) {
    json doc = tiny_tokenizer();
    doc[at] = std::move(value);
    return doc;
  };
  expect_load_error(with("/model/type"_json_pointer, "WordPiece"), {"model type", "WordPiece"});
  expect_load_error(with("/model/dropout"_json_pointer, 0.1), {"dropout"});
  expect_load_error(with("/model/byte_fallback"_json_pointer, true), {"byte_fallback"});
  expect_load_error(with("/model/continuing_subword_prefix"_json_pointer, "##"), {"continuing_subword_prefix"});
  expect_load_error(with("/normalizer"_json_pointer, {{"type", "Lowercase"}}), {"normalizer", "Lowercase"});
  expect_load_error(with("/pre_tokenizer"_json_pointer, {{"type", "Metaspace"}}), {"pre_tokenizer", "Metaspace"});
  expect_load_error(with("/pre_tokenizer"_json_pointer, {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}},
                                                        {"behavior", "Isolated"}, {"invert", true}}),
                    {"invert"});
  expect_load_error(with("/pre_tokenizer"_json_pointer, {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                                                        {"behavior", "Isolated"}}),
                    {"regex", "(unclosed"});
  expect_load_error(with("/pre_tokenizer"_json_pointer, nullptr), {"ByteLevel"});
  expect_load_error(with("/decoder"_json_pointer, {{"type", "WordPiece"}}), {"decoder", "WordPiece"});
  expect_load_error(with("/post_processor"_json_pointer, {{"type", "BertProcessing"}}), {"post_processor", "BertProcessing"});
  expect_load_error(with("/model/merges"_json_pointer, json::array({"a zz"})), {"merges[0]", "zz"});
  expect_load_error(with("/model/merges"_json_pointer, json::array({"abc"})), {"merges[0]"});
}

TEST(TokenizerErrors, BadInputIsNamed) {
  const Tokenizer tok = build(tiny_tokenizer());
  try {
    tok.encode(std::string("ok\xC3(", 4));
    ADD_FAILURE() << "invalid UTF-8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 2"), std::string::npos) << e.what();
  }
  const std::vector<uint32_t> bad_id{999};
  EXPECT_THROW(tok.decode(bad_id), Error);
  try {
    Tokenizer::load("/nonexistent/tokenizer-dir");
    ADD_FAILURE() << "loaded a missing folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer-dir/tokenizer.json"), std::string::npos);
  }
}

TEST(TokenizerUtf8, LossyDecodingReplacesMaximalSubparts) {
  // The cases of the Unicode standard's "U+FFFD substitution of maximal subparts" table.
  EXPECT_EQ(utf8::lossy("a\x80" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8::lossy("\xE2\x82"), "\xEF\xBF\xBD");              // truncated: one replacement
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98" "x"), "\xEF\xBF\xBD" "x");  // broken 4-byte sequence
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: 3
  EXPECT_EQ(utf8::lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  std::string out;
  EXPECT_EQ(utf8::append_lossy("ab\xE2\x82", out, false), 2u);  // holds back the incomplete tail
  EXPECT_EQ(out, "ab");
}

}  // namespace
}  // namespace petrel
