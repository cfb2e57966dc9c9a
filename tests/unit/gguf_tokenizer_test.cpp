// A GGUF file's tokenizer and chat template (tokenizer.ggml.*, tokenizer.chat_template), written
// from a tokenizer folder as llama.cpp's converter writes them, encode, decode and render as the
// folder's tokenizer.json and template do; unknown tokenizers are named.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "gguf_vocab.h"
#include "io/gguf_tokenizer.h"
#include "io/model_tokenizer.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

namespace petrel {
namespace {

using nlohmann::ordered_json;
using test::GgufWriter;
using test::TempDir;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

// The converter's GGUF of tokenizer folder `dir`: its vocabulary and template, no tensors.
std::string write_vocab_gguf(const TempDir& tmp, const std::filesystem::path& dir, size_t vocab_size,
                             const std::string& pre = "qwen2") {
  GgufWriter w;
  w.kv_string("general.architecture", "qwen3");
  test::write_gguf_vocab(w, dir, vocab_size, pre);
  const std::string path = tmp.str("vocab.gguf");
  w.write(path);
  return path;
}

// Every corpus text encodes to the same ids through both tokenizers, and those ids decode alike.
void expect_same_tokenizer(const Tokenizer& gguf, const Tokenizer& json, const ordered_json& corpus) {
  EXPECT_EQ(gguf.vocab_size(), json.vocab_size());
  for (const auto& [name, text] : corpus.items()) {
    const auto ids = json.encode(text.get<std::string>());
    EXPECT_EQ(gguf.encode(text.get<std::string>()), ids) << name;
    EXPECT_EQ(gguf.decode(ids), json.decode(ids)) << name;
  }
}

ChatRequest request_of(const ordered_json& conv) {
  ChatRequest r;
  r.messages = conv["messages"];
  if (conv.contains("tools")) r.tools = conv["tools"];
  r.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
  if (conv.contains("kwargs")) r.kwargs = conv["kwargs"];
  return r;
}

// Both templates render every test conversation to the same text, or both fail.
void expect_same_template(const ChatTemplate& gguf, const ChatTemplate& folder) {
  for (const auto& conv : test::read_json(test::tokenizer_fixtures() / "conversations.json")) {
    const ChatRequest req = request_of(conv);
    std::string want, got;
    try {
      want = folder.apply(req);
    } catch (const Error&) {
      EXPECT_THROW(gguf.apply(req), Error) << conv["name"];
      continue;
    }
    EXPECT_EQ(gguf.apply(req), want) << conv["name"];
  }
}

ordered_json corpus() { return test::read_json(test::tokenizer_fixtures() / "corpus.json"); }

TEST(GgufTokenizer, Qwen3VocabularyEncodesAsTokenizerJson) {
  PETREL_REQUIRE_QWEN3();
  TempDir tmp;
  const std::string path = write_vocab_gguf(tmp, test::qwen3_dir(), 151936);  // Qwen3's config.json vocab_size
  const Tokenizer gguf = load_tokenizer(path);
  expect_same_tokenizer(gguf, test::qwen3(), corpus());
  // The goldens are Hugging Face tokenizers' own ids.
  const auto goldens = test::read_json(test::tokenizer_fixtures() / "encode_goldens.json")["qwen3"];
  const ordered_json texts = corpus();
  for (const auto& [name, text] : texts.items())
    EXPECT_EQ(gguf.encode(text.get<std::string>()), goldens[name].get<std::vector<uint32_t>>()) << name;
  EXPECT_EQ(gguf.token_id("<|im_end|>"), 151645u);
  EXPECT_TRUE(gguf.is_special(151645));
  EXPECT_FALSE(gguf.is_special(151667));  // <think>: an added token, not special
  EXPECT_THROW(gguf.decode(std::vector<uint32_t>{151700}), Error);  // a [PAD] filler is no token
}

TEST(GgufTokenizer, Qwen3ChatTemplateRendersAsTheFolders) {
  PETREL_REQUIRE_QWEN3();
  TempDir tmp;
  const std::string path = write_vocab_gguf(tmp, test::qwen3_dir(), 151936);
  expect_same_template(load_chat_template(path), ChatTemplate::load(test::qwen3_dir()));
}

TEST(GgufTokenizer, Qwen35PreTokenizerKeepsCombiningMarksInWords) {
  PETREL_REQUIRE_QWEN3();
  TempDir tmp;
  const std::string path = write_vocab_gguf(tmp, test::qwen3_dir(), 151936, "qwen35");
  // The Qwen3 vocabulary under Qwen3.5's pre-tokenizer regex, as a tokenizer.json.
  auto doc = nlohmann::json::parse(test::read_file(test::qwen3_dir() / "tokenizer.json"));
  doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const Tokenizer json = Tokenizer::from_json_text(doc.dump(), "qwen35 variant");
  // Words with combining marks, which Qwen2's regex splits off their letters and Qwen3.5's keeps.
  const std::vector<std::string> marked = {"x\u0301\u0302yz", "\u0928\u092e\u0938\u094d\u0924\u0947",
                                           "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a"};
  auto texts = corpus();
  bool any_differs = false;
  for (size_t i = 0; i < marked.size(); ++i) {
    texts["marked" + std::to_string(i)] = marked[i];
    any_differs = any_differs || json.encode(marked[i]) != test::qwen3().encode(marked[i]);
  }
  EXPECT_TRUE(any_differs) << "the marked words do not tell the two regexes apart";
  expect_same_tokenizer(load_tokenizer(path), json, texts);
}

TEST(GgufTokenizer, TinyModelTokenizerAndTemplate) {
  TempDir tmp;
  const std::string path = write_vocab_gguf(tmp, test::tiny_model_dir(), 384);
  expect_same_tokenizer(load_tokenizer(path), Tokenizer::load(test::tiny_model_dir()), corpus());
  expect_same_template(load_chat_template(path), ChatTemplate::load(test::tiny_model_dir()));
}

TEST(GgufTokenizer, CliTokenizesAGgufFile) {
  TempDir tmp;
  const std::string path = write_vocab_gguf(tmp, test::tiny_model_dir(), 384);
  const std::string args = " --text 'Reverse the word petrel.<|im_end|>'";
  const auto want = test::run_petrel("tokenize " + test::tiny_model_dir() + args);
  ASSERT_EQ(want.status, 0) << want.out;
  EXPECT_EQ(test::run_petrel("tokenize " + path + args).out, want.out);
}

// ------------------------------------------------------------------------------------- errors

std::string tokenizer_error(const TempDir& tmp, const std::function<void(GgufWriter&)>& fill) {
  GgufWriter w;
  fill(w);
  const std::string path = tmp.str("t.gguf");
  w.write(path);
  try {
    load_tokenizer(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GgufTokenizerErrors, UnknownModelAndPreAreNamed) {
  TempDir tmp;
  EXPECT_EQ(tokenizer_error(tmp, [](GgufWriter& w) { w.kv_string("tokenizer.ggml.model", "llama"); }),
            tmp.str("t.gguf") + ": metadata key 'tokenizer.ggml.model' is 'llama', a tokenizer Petrel does not read "
                                "(it reads gpt2, byte-level BPE)");
  EXPECT_EQ(tokenizer_error(tmp,
                            [](GgufWriter& w) {
                              w.kv_string("tokenizer.ggml.model", "gpt2");
                              w.kv_string("tokenizer.ggml.pre", "llama-bpe");
                            }),
            tmp.str("t.gguf") + ": metadata key 'tokenizer.ggml.pre' is 'llama-bpe', a pre-tokenizer Petrel does not "
                                "know (it knows qwen2, qwen35)");
  EXPECT_EQ(tokenizer_error(tmp, [](GgufWriter&) {}),
            tmp.str("t.gguf") + ": missing metadata key 'tokenizer.ggml.model' (expected a STRING)");
}

TEST(GgufTokenizerErrors, BadTokenTypeAndMergeAreNamed) {
  TempDir tmp;
  auto vocab = [](GgufWriter& w, std::vector<int32_t> types, std::vector<std::string> merges) {
    w.kv_string("tokenizer.ggml.model", "gpt2");
    w.kv_string("tokenizer.ggml.pre", "qwen2");
    w.kv_strings("tokenizer.ggml.tokens", {"a", "b"});
    w.kv_array("tokenizer.ggml.token_type", GgufType::I32, types);
    w.kv_strings("tokenizer.ggml.merges", merges);
  };
  EXPECT_EQ(tokenizer_error(tmp, [&](GgufWriter& w) { vocab(w, {1, 6}, {}); }),
            tmp.str("t.gguf") + ": metadata key 'tokenizer.ggml.token_type' gives token 1 ('b') type 6, which a gpt2 "
                                "vocabulary does not use (expected 1 normal, 3 control, 4 user-defined or 5 unused)");
  EXPECT_EQ(tokenizer_error(tmp, [&](GgufWriter& w) { vocab(w, {1}, {}); }),
            tmp.str("t.gguf") + ": metadata key 'tokenizer.ggml.token_type' has 1 entries, expected one per token (2)");
  EXPECT_EQ(tokenizer_error(tmp, [&](GgufWriter& w) { vocab(w, {1, 1}, {"ab"}); }),
            tmp.str("t.gguf") + ": metadata key 'tokenizer.ggml.merges' entry 0 is 'ab', expected two symbols "
                                "separated by one space");
}

TEST(GgufTokenizerErrors, MissingTemplateIsNamed) {
  TempDir tmp;
  GgufWriter w;
  w.kv_strings("tokenizer.ggml.tokens", {"a"});
  w.write(tmp.str("t.gguf"));
  try {
    load_chat_template(tmp.str("t.gguf"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "no chat template in " + tmp.str("t.gguf") + " (expected metadata key 'tokenizer.chat_template')");
  }
}

}  // namespace
}  // namespace petrel
