// The multi-token prediction head: loaded from both on-disk layouts, its logits equal an independent
// numpy implementation (tools/mtp_fixture.py) given the trunk's hidden states, and speculative
// decoding with its drafts gives exactly the tokens of plain decoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../unit/open_error.h"
#include "../unit/test_util.h"
#include "core/error.h"
#include "core/npy.h"
#include "cpu_fixture.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"
#include "generate/mtp_draft.h"

namespace petrel {
namespace {

namespace fs = std::filesystem;
using test::CpuFixture;

const std::vector<std::string> kMtpFixtures = {"qwen35moe-mtp", "qwen3next-mtp"};
constexpr int kTokens = 64;

std::vector<int32_t> reference_prompt(const std::string& name) {
  const auto j = nlohmann::json::parse(std::ifstream(test::fixture_model(name) + "/reference.json"));
  return j["prompt_ids"].get<std::vector<int32_t>>();
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

// Like expect_near over whole rows, relative to the largest logit magnitude of the reference.
void expect_close(const float* got, const float* want, size_t n, const std::string& what) {
  float scale = 0, diff = 0;
  for (size_t i = 0; i < n; ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    diff = std::max(diff, std::fabs(got[i] - want[i]));
  }
  ASSERT_GT(scale, 0.0f) << what;
  EXPECT_LE(diff, 2e-3f * scale) << what << ": max |diff| " << diff << " of max |logit| " << scale;
}

class Mtp : public ::testing::TestWithParam<std::string> {};

TEST_P(Mtp, LoadsTheHeadInTheTrunksLayout) {
  const auto ck = Checkpoint::open(test::fixture_model(GetParam()));
  const ModelConfig& c = ck->config();
  const MtpWeights& M = ck->weights().mtp;
  EXPECT_EQ(c.mtp_layers, 1);
  ASSERT_EQ(M.layers.size(), 1u);
  EXPECT_EQ(M.fc.rows, c.hidden);
  EXPECT_EQ(M.fc.cols, 2 * c.hidden);
  for (const auto* v : {&M.embed_norm, &M.hidden_norm, &M.norm}) EXPECT_EQ(int(v->size()), c.hidden);
  const LayerWeights& L = M.layers[0];
  EXPECT_EQ(L.kind, LayerKind::FullAttention);
  EXPECT_TRUE(L.attn.gate.valid());
  EXPECT_TRUE(L.ffn.moe);
  EXPECT_EQ(int(L.ffn.experts.size()), c.n_experts);
  EXPECT_TRUE(L.ffn.has_shared);
  for (const std::string& name : ck->info().skipped) EXPECT_NE(name.rfind("mtp.", 0), 0u) << name << " was skipped";
}

// Row t of the head pairs h_t with prompt token t+1; the reference computed it in numpy from the
// same hidden states (which it checked against the Hugging Face logits) and the safetensors.
TEST_P(Mtp, LogitsMatchTheNumpyReference) {
  CpuFixture f(GetParam());
  const std::string dir = test::fixture_model(GetParam());
  const std::vector<int32_t> ids = reference_prompt(GetParam());
  const int T = int(ids.size()), V = f.vocab();
  auto st = f.model->new_sequence(T);
  f.model->forward(ids.data(), T, *st, nullptr);
  auto mtp = f.model->new_mtp_sequence(T + 8);
  std::vector<float> logits(size_t(T - 1) * V);
  const int32_t guess = f.model->mtp_forward(ids.data() + 1, T - 1, /*from_trunk=*/true, *mtp, logits.data());

  const NpyArray want = read_npy_f32(dir + "/mtp_logits.npy");
  ASSERT_EQ(want.shape, (std::vector<int64_t>{T - 1, V}));
  for (int t = 0; t < T - 1; t += 17)
    expect_close(&logits[size_t(t) * V], &want.data[size_t(t) * V], size_t(V), "row " + std::to_string(t));
  expect_close(&logits[size_t(T - 2) * V], &want.data[size_t(T - 2) * V], size_t(V), "last row");

  // Chained drafting: each step reads the head's own previous output and the token it guessed.
  const auto chain = nlohmann::json::parse(std::ifstream(dir + "/mtp_chain.json"));
  const auto tokens = chain["tokens"].get<std::vector<int32_t>>();
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(guess, tokens[0]);
  for (size_t s = 0; s < tokens.size(); ++s) {
    std::vector<float> row(V);
    f.model->mtp_forward(&tokens[s], 1, /*from_trunk=*/false, *mtp, row.data());
    const auto want_row = chain["logits"][s].get<std::vector<float>>();
    expect_close(row.data(), want_row.data(), size_t(V), "chained step " + std::to_string(s));
  }
}

struct Outcome {
  std::vector<int32_t> tokens;
  GenerationStats stats;
};

Outcome generate(Model& model, Generator& generator, const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                 int draft) {
  auto st = model.new_sequence(int(prompt.size()) + kTokens);
  GenerateRequest req;
  req.tokens = prompt;
  req.sampling = sampling;
  req.max_tokens = kTokens;
  req.speculative.draft = draft;
  req.speculative.source = DraftSource::Mtp;
  const GenerateResult r = generator.generate(st, req, [](int32_t) { return true; });
  return {r.tokens, r.stats};
}

// A prompt longer than a prefill chunk, so the head also reads hidden rows of earlier chunks.
TEST_P(Mtp, GreedyEqualsPlainGreedyForEveryDraftLength) {
  CpuFixture f(GetParam(), /*max_chunk=*/64);
  HostDecoder decoder(*f.model);
  Generator generator(decoder);
  SamplingParams sticky = greedy();
  sticky.repetition_penalty = 0.3f;  // the model loops, so the rows after an accepted draft run too
  for (const SamplingParams& sampling : {greedy(), sticky}) {
    const std::vector<int32_t> prompt = reference_prompt(GetParam());
    const Outcome plain = generate(*f.model, generator, prompt, sampling, 0);
    ASSERT_EQ(int(plain.tokens.size()), kTokens);
    for (int k = 1; k <= 4; ++k) {
      SCOPED_TRACE("draft " + std::to_string(k) + ", repetition penalty " + std::to_string(sampling.repetition_penalty));
      const Outcome spec = generate(*f.model, generator, prompt, sampling, k);
      EXPECT_EQ(spec.tokens, plain.tokens);
      EXPECT_GT(spec.stats.verify_steps, 0);
      EXPECT_GT(spec.stats.drafted, 0);
    }
  }
}

// Drafts are the head's argmaxes: a deterministic draft keeps sampling exact too.
TEST_P(Mtp, SeededSamplingEqualsPlainSampling) {
  CpuFixture f(GetParam());
  HostDecoder decoder(*f.model);
  Generator generator(decoder);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.seed = 7;
  const std::vector<int32_t> prompt = reference_prompt(GetParam());
  const Outcome plain = generate(*f.model, generator, prompt, p, 0);
  const Outcome spec = generate(*f.model, generator, prompt, p, 3);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.verify_steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Mtp, ::testing::ValuesIn(kMtpFixtures),
                         [](const auto& info) { return test::param_name(info.param); });

// The drafter's chain equals the numpy reference's, and chaining leaves the head's cache as the
// advance left it: a drafter that drafted continues exactly like one that did not.
TEST(MtpDrafter, ChainsLikeTheReferenceAndLeavesNoTrace) {
  CpuFixture f("qwen35moe-mtp");
  const std::vector<int32_t> ids = reference_prompt("qwen35moe-mtp");
  const int T = int(ids.size());
  const auto chain = nlohmann::json::parse(std::ifstream(test::fixture_model("qwen35moe-mtp") + "/mtp_chain.json"));
  const auto want = chain["tokens"].get<std::vector<int32_t>>();
  auto st = f.model->new_sequence(T + 8);
  f.model->forward(ids.data(), T - 1, *st, nullptr);
  MtpDrafter drafted(*f.model, T + 8), plain(*f.model, T + 8);
  drafted.advance(ids.data() + 1, T - 1);
  EXPECT_EQ(drafted.draft(int(want.size())), want);
  EXPECT_EQ(drafted.draft(1), std::vector<int32_t>{want[0]});
  plain.advance(ids.data() + 1, T - 1);  // the trunk's rows are still those of its last step

  f.model->forward(&ids[size_t(T - 1)], 1, *st, nullptr);
  const int32_t next = want[0];
  drafted.advance(&next, 1);
  const std::vector<int32_t> after_drafting = drafted.draft(3);
  plain.advance(&next, 1);
  EXPECT_EQ(after_drafting, plain.draft(3));
}

// A chained step reads the model's last head output: after another state's step that would be
// the wrong one, and it is refused.
TEST(MtpDrafter, ChainingAfterAnotherStatesStepIsRefused) {
  CpuFixture f("qwen35moe-mtp");
  const std::vector<int32_t> ids = reference_prompt("qwen35moe-mtp");
  auto st = f.model->new_sequence(16);
  f.model->forward(ids.data(), 8, *st, nullptr);
  auto a = f.model->new_mtp_sequence(16), b = f.model->new_mtp_sequence(16);
  f.model->mtp_forward(ids.data() + 1, 8, /*from_trunk=*/true, *a);
  f.model->mtp_forward(ids.data() + 1, 8, /*from_trunk=*/true, *b);
  try {
    f.model->mtp_forward(ids.data(), 1, /*from_trunk=*/false, *a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("continued another head state"), std::string::npos) << e.what();
  }
}

// After a verify step the head reads all of its accepted rows at once; that must equal reading
// them one plain step at a time.
TEST(MtpDrafter, OneStepOfSeveralRowsEqualsOneRowAtATime) {
  CpuFixture f("qwen35moe-mtp");
  const std::vector<int32_t> ids = reference_prompt("qwen35moe-mtp");
  const int P = 100;
  auto a = f.model->new_sequence(P + 8), b = f.model->new_sequence(P + 8);
  MtpDrafter at_once(*f.model, P + 8), one_by_one(*f.model, P + 8);
  f.model->forward(ids.data(), P - 3, *a, nullptr);
  at_once.advance(ids.data() + 1, P - 3);
  f.model->forward(ids.data(), P - 3, *b, nullptr);
  one_by_one.advance(ids.data() + 1, P - 3);
  f.model->forward(ids.data() + P - 3, 3, *a, nullptr);
  at_once.advance(ids.data() + P - 2, 3);
  const std::vector<int32_t> draft = at_once.draft(3);
  for (int i = 0; i < 3; ++i) {
    f.model->forward(&ids[size_t(P - 3 + i)], 1, *b, nullptr);
    one_by_one.advance(&ids[size_t(P - 2 + i)], 1);
  }
  EXPECT_EQ(draft, one_by_one.draft(3));
}

// On this looping prompt the random head's drafts are sometimes right, so a verify step accepts
// drafts and the head then reads several rows of it.
TEST(MtpSpeculative, AcceptedDraftsKeepTheOutputExact) {
  CpuFixture f("qwen3next-mtp");
  HostDecoder decoder(*f.model);
  Generator generator(decoder);
  SamplingParams sticky = greedy();
  sticky.repetition_penalty = 0.3f;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), {5, 200, 17, 93, 41});
  const Outcome plain = generate(*f.model, generator, prompt, sticky, 0);
  const Outcome spec = generate(*f.model, generator, prompt, sticky, 3);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.accepted, 0) << "no draft accepted: the rows after an acceptance were not exercised";
}

// Fixtures without a head: one with no mtp.* tensors, one with a partial set and no config key
// (the head is skipped as it always was).
TEST(MtpLoad, CheckpointsWithoutAHeadLoadAsBefore) {
  for (const char* name : {"qwen35moe-text-per-expert", "qwen35moe-vlm-fused"}) {
    const auto ck = Checkpoint::open(test::fixture_model(name));
    EXPECT_EQ(ck->config().mtp_layers, 0) << name;
    EXPECT_TRUE(ck->weights().mtp.layers.empty()) << name;
  }
  const auto ck = Checkpoint::open(test::fixture_model("qwen35moe-vlm-fused"));
  const auto& skipped = ck->info().skipped;
  EXPECT_NE(std::find(skipped.begin(), skipped.end(), "mtp.fc.weight"), skipped.end());
}

TEST(MtpLoad, SpeculativeMtpWithoutAHeadIsAClearError) {
  CpuFixture f("qwen35moe-text-per-expert");
  HostDecoder decoder(*f.model);
  Generator generator(decoder);
  try {
    generate(*f.model, generator, reference_prompt("qwen35moe-text-per-expert"), greedy(), 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--speculative mtp needs a checkpoint with a multi-token prediction head"),
              std::string::npos)
        << e.what();
  }
}

// A copy of the Qwen3.5 MTP fixture with one tensor changed.
struct BrokenMtp {
  test::TempDir dir;
  std::map<std::string, test::RawTensor> tensors;
  BrokenMtp() {
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(test::fixture_model("qwen35moe-mtp") + "/" + f, dir.str(f));
    tensors = test::read_all(dir.str("model.safetensors"));
  }
  std::string error() {
    test::write_safetensors(dir.str("model.safetensors"), tensors);
    return test::open_error(dir.str());
  }
};

TEST(MtpLoad, WrongShapeNamesTheTensor) {
  BrokenMtp ck;
  std::swap(ck.tensors.at("mtp.fc.weight").shape[0], ck.tensors.at("mtp.fc.weight").shape[1]);
  const std::string msg = ck.error();
  EXPECT_NE(msg.find("tensor 'mtp.fc.weight' (mtp fc"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape [128, 64], expected [64, 128]"), std::string::npos) << msg;
}

TEST(MtpLoad, MissingLayerTensorIsNamed) {
  BrokenMtp ck;
  ASSERT_EQ(ck.tensors.erase("mtp.layers.0.self_attn.k_norm.weight"), 1u);
  const std::string msg = ck.error();
  EXPECT_NE(msg.find("missing tensor 'mtp.layers.0.self_attn.k_norm.weight' (mtp layer 0 attention k_norm)"),
            std::string::npos)
      << msg;
}

TEST(MtpLoad, DeeperHeadsAreRefusedByName) {
  BrokenMtp ck;
  auto cfg = nlohmann::json::parse(std::ifstream(ck.dir.str("config.json")));
  cfg["text_config"]["mtp_num_hidden_layers"] = 2;
  std::ofstream(ck.dir.str("config.json")) << cfg.dump();
  const std::string msg = ck.error();
  EXPECT_NE(msg.find("mtp_num_hidden_layers is 2; heads of more than one layer are not supported"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace petrel
