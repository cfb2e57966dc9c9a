// Structured output on models/petrel-tiny: sampled answers held to JSON schemas parse and keep
// every constraint, through the generation loop (petrel run) and through the scheduler (petrel
// serve), where a grammar's rows are sampled on the host beside unconstrained ones.
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>
#include <regex>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"
#include "grammar/json_schema.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"
#include "runtime/scheduler.h"

namespace petrel {
namespace {

using grammar::Json;

// The chat prompt of "What is 48213 + 9377?" (docs/tiny-model.md) and the end-of-turn token.
const std::vector<int32_t> kPrompt = {1, 269, 201, 294, 292, 223, 22, 26, 20, 19, 21, 295, 223,
                                      27, 21, 25, 25, 33, 2, 201, 1, 271, 201};
constexpr int32_t kEndOfTurn = 2;

const Json& schema() {
  static const Json s = Json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "age": {"type": "integer", "minimum": 18, "maximum": 65},
      "score": {"type": "number", "minimum": -1, "maximum": 1},
      "role": {"enum": ["admin", "user"]},
      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}},
    "required": ["name", "age", "score", "role", "code"], "additionalProperties": false})");
  return s;
}

// Every constraint of schema(), checked by hand.
void expect_valid(const std::string& text) {
  const Json v = Json::parse(text);  // throws (fails the test) when it is not JSON
  ASSERT_TRUE(v.is_object()) << text;
  for (const auto& [key, value] : v.items())
    EXPECT_TRUE(schema()["properties"].contains(key)) << "unexpected " << key << " in " << text;
  ASSERT_TRUE(v["name"].is_string() && v["age"].is_number_integer() && v["score"].is_number()) << text;
  EXPECT_FALSE(v["name"].get<std::string>().empty()) << text;
  EXPECT_TRUE(v["age"].get<int>() >= 18 && v["age"].get<int>() <= 65) << text;
  EXPECT_TRUE(v["score"].get<double>() >= -1 && v["score"].get<double>() <= 1) << text;
  EXPECT_TRUE(v["role"] == "admin" || v["role"] == "user") << text;
  EXPECT_TRUE(std::regex_match(v["code"].get<std::string>(), std::regex("[A-Z]{2}-[0-9]{3}"))) << text;
  if (v.contains("tags")) {
    EXPECT_TRUE(v["tags"].is_array() && v["tags"].size() <= 3) << text;
  }
}

class StructuredOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    ck_ = Checkpoint::open(test::tiny_model_dir());
    model_ = std::make_unique<Model>(ck_->config(), ck_->weights(), backend_);
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(test::tiny_model_dir()));
    auto vocab = std::make_shared<grammar::TokenVocab>(grammar::make_token_vocab(*tokenizer_, ck_->config().vocab));
    grammar_ = std::make_shared<grammar::TokenGrammar>(grammar::json_schema_grammar(schema()), vocab);
  }

  std::string text(const std::vector<int32_t>& ids) const {
    std::vector<uint32_t> u(ids.begin(), ids.end());
    if (!u.empty() && int32_t(u.back()) == kEndOfTurn) u.pop_back();
    return tokenizer_->decode(u);
  }

  std::unique_ptr<Checkpoint> ck_;
  CpuBackend backend_{CpuOptions{1}};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<const grammar::TokenGrammar> grammar_;
};

TEST_F(StructuredOutput, SampledAnswersOfTheGenerationLoopKeepTheSchema) {
  HostDecoder decoder(*model_);
  Generator generator(decoder);
  for (uint64_t seed = 0; seed < 12; ++seed) {
    GenerateRequest req;
    req.tokens = kPrompt;
    req.sampling.temperature = seed == 0 ? 0.0f : 1.0f;
    req.sampling.seed = seed;
    req.eos_ids = {kEndOfTurn};
    req.max_tokens = 400;
    req.grammar = grammar_;
    auto st = model_->new_sequence(512);
    const GenerateResult r = generator.generate(st, req, [](int32_t) { return true; });
    ASSERT_EQ(r.reason, FinishReason::Eos) << text(r.tokens);
    expect_valid(text(r.tokens));
  }
}

TEST_F(StructuredOutput, TheSchedulerHoldsConstrainedRowsBesideFreeOnes) {
  Scheduler scheduler(*model_, SchedulerOptions{.max_sequences = 4, .context = 512});
  std::vector<std::future<std::vector<int32_t>>> answers;
  std::vector<std::shared_ptr<std::promise<std::vector<int32_t>>>> promises;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    CompletionRequest req;
    req.prompt = kPrompt;
    req.sampling.temperature = 1.0f;
    req.sampling.seed = seed;
    req.eos_ids = {kEndOfTurn};
    req.max_tokens = 400;
    if (seed % 4 != 3) req.grammar = grammar_;  // every fourth one answers freely
    auto done = std::make_shared<std::promise<std::vector<int32_t>>>();
    answers.push_back(done->get_future());
    auto tokens = std::make_shared<std::vector<int32_t>>();
    ASSERT_EQ(scheduler.submit(std::move(req),
                               [done, tokens](const StepEvent& e) {
                                 if (e.token >= 0) tokens->push_back(e.token);
                                 if (e.done) done->set_value(e.error.empty() ? *tokens : std::vector<int32_t>{-1});
                                 return true;
                               }),
              SubmitStatus::Accepted);
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    const std::vector<int32_t> ids = answers[i].get();
    ASSERT_NE(ids, std::vector<int32_t>{-1});
    if (i % 4 == 3) continue;
    ASSERT_EQ(ids.back(), kEndOfTurn) << text(ids);
    expect_valid(text(ids));
  }
}

}  // namespace
}  // namespace petrel
