// Encodings and decodings agree with Hugging Face `tokenizers` (goldens from tools/tokenizer).
#include <gtest/gtest.h>

#include <thread>

#include "tokenizer_test_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace petrel {
namespace {

using test::read_json;
using test::tokenizer_fixtures;

std::string describe_mismatch(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream s;
  s << "first difference at index " << i << " of " << want.size() << " (got " << got.size() << " ids): got ";
  for (size_t k = i; k < std::min(got.size(), i + 6); ++k) s << got[k] << ' ';
  s << "want ";
  for (size_t k = i; k < std::min(want.size(), i + 6); ++k) s << want[k] << ' ';
  return s.str();
}

void expect_corpus_matches(const Tokenizer& tok, const nlohmann::ordered_json& corpus,
                           const nlohmann::ordered_json& goldens, const std::string& label) {
  for (const auto& [name, text] : corpus.items()) {
    ASSERT_TRUE(goldens.contains(name)) << label << ": no golden for " << name;
    const auto want = goldens[name].get<std::vector<uint32_t>>();
    const auto got = tok.encode(text.get<std::string>());
    EXPECT_EQ(got, want) << label << "/" << name << ": " << describe_mismatch(got, want);
  }
}

TEST(TokenizerGolden, Qwen3CorpusMatchesHuggingFace) {
  PETREL_REQUIRE_QWEN3();
  expect_corpus_matches(test::qwen3(), read_json(tokenizer_fixtures() / "corpus.json"),
                        read_json(tokenizer_fixtures() / "encode_goldens.json")["qwen3"], "qwen3");
}

TEST(TokenizerGolden, DecodeOfEncodeIsNfcOfInput) {
  PETREL_REQUIRE_QWEN3();
  const auto nfc = tokenizer::Normalizer::from_json({{"type", "NFC"}});
  const auto corpus = read_json(tokenizer_fixtures() / "corpus.json");
  for (const auto& [name, text] : corpus.items()) {
    const std::string s = text.get<std::string>();
    EXPECT_EQ(test::qwen3().decode(test::qwen3().encode(s)), nfc.apply(s)) << name;
  }
}

TEST(TokenizerGolden, VariantTokenizersMatchHuggingFace) {
  PETREL_REQUIRE_QWEN3();
  const auto base = nlohmann::json::parse(test::read_file(test::qwen3_dir() / "tokenizer.json"));
  const auto corpus = read_json(tokenizer_fixtures() / "corpus.json");
  const auto goldens = read_json(tokenizer_fixtures() / "encode_goldens.json");
  const auto variants = read_json(tokenizer_fixtures() / "variants.json");
  for (const auto& variant : variants) {
    const std::string name = variant["name"];
    SCOPED_TRACE(name);
    const auto tok = Tokenizer::from_json_text(test::apply_patches(base, variant["patches"]).dump(), name);
    auto texts = corpus;
    if (variant.contains("extra_corpus"))
      for (const auto& [k, v] : variant["extra_corpus"].items()) texts[k] = v;
    expect_corpus_matches(tok, texts, goldens[name], name);
  }
}

TEST(TokenizerGolden, DecodeMatchesHuggingFace) {
  PETREL_REQUIRE_QWEN3();
  const auto cases = read_json(tokenizer_fixtures() / "decode_goldens.json");
  for (const auto& c : cases) {
    const auto ids = c["ids"].get<std::vector<uint32_t>>();
    const std::string got = test::qwen3().decode(ids, c["skip_special"].get<bool>());
    EXPECT_EQ(got, c["text"].get<std::string>()) << c["name"].get<std::string>();
    EXPECT_TRUE(utf8::is_valid(got)) << c["name"].get<std::string>();
  }
}

TEST(TokenizerGolden, ConcurrentEncodesAgree) {
  PETREL_REQUIRE_QWEN3();
  // A server encodes requests on several threads at once; the shared word cache must not mix them.
  const auto corpus = read_json(tokenizer_fixtures() / "corpus.json");
  const auto goldens = read_json(tokenizer_fixtures() / "encode_goldens.json")["qwen3"];
  test::qwen3().clear_cache();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (const auto& [name, text] : corpus.items())
          mismatches[t] += test::qwen3().encode(text.get<std::string>()) != goldens[name].get<std::vector<uint32_t>>();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace petrel
