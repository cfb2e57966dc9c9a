// GGUF checkpoints (qwen3, qwen3moe): the safetensors fixtures written as llama.cpp's converter
// writes them (renamed tensors in ggml dim order, stacked experts, its metadata keys) open into the
// same config and weights, and give the same logits; Q8_0 matrices decode as Q8_0; defects name
// the file, the tensor or key, and what was expected. (The qwen3moe fixture's dense layer 0,
// which the converter has no names for, is written as a qwen3 MLP: ffn_gate/up/down.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <regex>

#include "core/error.h"
#include "gguf_writer.h"
#include "checkpoint_logits.h"
#include "io/checkpoint.h"
#include "open_error.h"
#include "test_util.h"

namespace petrel {
namespace {

using test::GgufWriter;
using test::TempDir;

// How a test wants a matrix stored: as the fixture has it, or re-encoded.
using Encode = std::function<void(const std::string& name, GgmlType* type, std::vector<uint8_t>* bytes)>;

std::string gguf_name(const std::string& hf) {
  static const std::pair<std::regex, const char*> kRenames[] = {
      {std::regex(R"(^model\.embed_tokens\.weight$)"), "token_embd.weight"},
      {std::regex(R"(^lm_head\.weight$)"), "output.weight"},
      {std::regex(R"(^model\.norm\.weight$)"), "output_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.input_layernorm\.weight$)"), "blk.$1.attn_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.post_attention_layernorm\.weight$)"), "blk.$1.ffn_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.self_attn\.o_proj\.weight$)"), "blk.$1.attn_output.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.weight$)"), "blk.$1.attn_$2.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.self_attn\.(q|k)_norm\.weight$)"), "blk.$1.attn_$2_norm.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.mlp\.gate\.weight$)"), "blk.$1.ffn_gate_inp.weight"},
      {std::regex(R"(^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$)"), "blk.$1.ffn_$2.weight"},
  };
  for (const auto& [re, to] : kRenames)
    if (std::regex_match(hf, re)) return std::regex_replace(hf, re, to);
  ADD_FAILURE() << "no GGUF name for " << hf;
  return hf;
}

GgmlType ggml_of(const std::string& dtype) {
  if (dtype == "F32") return GgmlType::F32;
  EXPECT_EQ(dtype, "BF16");
  return GgmlType::BF16;
}

// Writes fixture `name` as a GGUF file at `path`; `encode` may re-encode each 2-D weight.
void convert(const std::string& name, const std::string& path, const Encode& encode = {}) {
  const std::string dir = test::fixture_model(name);
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  const std::string arch = cfg["model_type"] == "qwen3" ? "qwen3" : "qwen3moe";
  GgufWriter w;
  w.kv_string("general.architecture", arch);
  auto u32 = [&](const std::string& key, const nlohmann::json& v) { w.kv(arch + "." + key, GgufType::U32, v.get<uint32_t>()); };
  u32("block_count", cfg["num_hidden_layers"]);
  u32("context_length", cfg["max_position_embeddings"]);
  u32("embedding_length", cfg["hidden_size"]);
  u32("feed_forward_length", cfg["intermediate_size"]);
  u32("attention.head_count", cfg["num_attention_heads"]);
  u32("attention.head_count_kv", cfg["num_key_value_heads"]);
  u32("attention.key_length", cfg["head_dim"]);
  u32("attention.value_length", cfg["head_dim"]);
  w.kv(arch + ".attention.layer_norm_rms_epsilon", GgufType::F32, cfg["rms_norm_eps"].get<float>());
  w.kv(arch + ".rope.freq_base", GgufType::F32, cfg["rope_parameters"]["rope_theta"].get<float>());
  if (arch == "qwen3moe") {
    u32("expert_count", cfg["num_local_experts"]);
    u32("expert_used_count", cfg["num_experts_per_tok"]);
    u32("expert_feed_forward_length", cfg["moe_intermediate_size"]);
  }
  std::vector<std::string> tokens;  // only their count matters here
  for (int i = 0; i < cfg["vocab_size"].get<int>(); ++i) tokens.push_back(std::string(1, char(i)));
  w.kv_strings("tokenizer.ggml.tokens", tokens);

  // Per-expert tensors are stacked per layer and projection, expert 0 first.
  std::map<std::string, std::vector<test::RawTensor>> stacks;
  const std::regex expert(R"(^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$)");
  auto add = [&](const std::string& gname, const std::string& dtype, std::vector<uint64_t> ne, std::vector<uint8_t> bytes) {
    GgmlType type = ggml_of(dtype);
    if (encode && ne.size() >= 2) encode(gname, &type, &bytes);
    w.tensor(gname, type, ne, bytes);
  };
  for (auto& [hf, t] : test::read_all(dir + "/model.safetensors")) {
    std::smatch m;
    if (std::regex_match(hf, m, expert)) {
      auto& stack = stacks["blk." + m[1].str() + ".ffn_" + m[3].str() + "_exps.weight"];
      const size_t e = std::stoul(m[2].str());
      if (stack.size() <= e) stack.resize(e + 1);
      stack[e] = t;
      continue;
    }
    add(gguf_name(hf), t.dtype, std::vector<uint64_t>(t.shape.rbegin(), t.shape.rend()), t.bytes);
  }
  for (const auto& [gname, stack] : stacks) {
    std::vector<uint8_t> bytes;
    for (const auto& t : stack) bytes.insert(bytes.end(), t.bytes.begin(), t.bytes.end());
    add(gname, stack[0].dtype, {uint64_t(stack[0].shape[1]), uint64_t(stack[0].shape[0]), stack.size()}, bytes);
  }
  w.write(path);
}

std::vector<float> rows_of(const Matrix& m) {
  std::vector<float> out(size_t(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.dequant_row(r, out.data() + r * m.cols);
  return out;
}

// Every matrix of a model, in a fixed order.
std::vector<const Matrix*> matrices(const ModelWeights& W) {
  std::vector<const Matrix*> out = {&W.embed, &W.lm_head};
  for (const auto& L : W.layers) {
    for (const Matrix* m : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o, &L.ffn.router, &L.ffn.dense.gate,
                            &L.ffn.dense.up, &L.ffn.dense.down})
      out.push_back(m);
    for (const auto& e : L.ffn.experts)
      for (const Matrix* m : {&e.gate, &e.up, &e.down}) out.push_back(m);
  }
  return out;
}

using test::open_error;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

class GgufCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufCheckpoint, OpensAsTheSafetensorsCheckpointDoes) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert(GetParam(), path);
  const auto hf = Checkpoint::open(test::fixture_model(GetParam()));
  const auto gg = Checkpoint::open(path);
  const ModelConfig &a = hf->config(), &b = gg->config();
  EXPECT_EQ(b.arch, a.arch);
  EXPECT_EQ(b.vocab, a.vocab);
  EXPECT_EQ(b.hidden, a.hidden);
  EXPECT_EQ(b.n_layers, a.n_layers);
  EXPECT_EQ(b.n_heads, a.n_heads);
  EXPECT_EQ(b.n_kv_heads, a.n_kv_heads);
  EXPECT_EQ(b.head_dim, a.head_dim);
  EXPECT_EQ(b.rotary_dim, a.rotary_dim);
  EXPECT_EQ(b.rope_theta, a.rope_theta);
  EXPECT_EQ(b.rms_eps, a.rms_eps);
  EXPECT_EQ(b.max_position, a.max_position);
  EXPECT_EQ(b.tie_embeddings, a.tie_embeddings);
  EXPECT_EQ(b.layer_is_moe, a.layer_is_moe);
  EXPECT_EQ(b.intermediate, a.intermediate);
  EXPECT_EQ(b.n_experts, a.n_experts);
  EXPECT_EQ(b.top_k, a.top_k);
  EXPECT_EQ(b.moe_intermediate, a.moe_intermediate);
  EXPECT_EQ(b.norm_topk_prob, a.norm_topk_prob);

  const auto ma = matrices(hf->weights()), mb = matrices(gg->weights());
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) {
    EXPECT_EQ(mb[i]->rows, ma[i]->rows) << mb[i]->name;
    EXPECT_EQ(mb[i]->cols, ma[i]->cols) << mb[i]->name;
    EXPECT_EQ(rows_of(*mb[i]), rows_of(*ma[i])) << mb[i]->name;
  }
  for (size_t i = 0; i < hf->weights().layers.size(); ++i) {
    const LayerWeights &la = hf->weights().layers[i], &lb = gg->weights().layers[i];
    EXPECT_EQ(lb.input_norm, la.input_norm);
    EXPECT_EQ(lb.post_norm, la.post_norm);
    EXPECT_EQ(lb.attn.q_norm, la.attn.q_norm);
    EXPECT_EQ(lb.attn.k_norm, la.attn.k_norm);
  }
  EXPECT_EQ(gg->weights().final_norm, hf->weights().final_norm);
  EXPECT_EQ(gg->info().format, CheckpointFormat::Gguf);
  EXPECT_EQ(gg->info().parameters, hf->info().parameters);
  EXPECT_EQ(gg->info().active_parameters, hf->info().active_parameters);
  EXPECT_EQ(gg->info().weight_bytes, hf->info().weight_bytes);
  EXPECT_TRUE(gg->info().skipped.empty());

  const std::vector<int32_t> prompt = test::reference_prompt(GetParam());
  EXPECT_EQ(test::prompt_logits(*gg, prompt), test::prompt_logits(*hf, prompt));
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufCheckpoint, ::testing::Values("qwen3-dense-f32", "qwen3moe"),
                         [](const auto& info) { return test::param_name(info.param); });

// Q8_0 with power-of-two scales, which f16 holds exactly: x ≈ d·q, q = round(x / d) in [-127, 127].
// Routers stay as they are, as llama.cpp's quantize leaves ffn_gate_inp: a flipped top-k choice
// would change a MoE layer's output far more than any rounding.
void to_q8_0(const std::string& name, GgmlType* type, std::vector<uint8_t>* bytes) {
  if (name.find("ffn_gate_inp") != std::string::npos) return;
  const size_t n = bytes->size() / (*type == GgmlType::F32 ? 4 : 2);
  std::vector<float> x(n);
  convert_to_f32(bytes->data(), *type == GgmlType::F32 ? DType::F32 : DType::BF16, n, x.data());
  std::vector<uint8_t> out;
  for (size_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const int e = int(std::ceil(std::log2(std::max(amax, 1e-30f) / 127.0f)));
    ASSERT_GE(e, -14);
    const float d = std::ldexp(1.0f, e);
    const uint16_t h = uint16_t((e + 15) << 10);
    out.push_back(uint8_t(h & 0xff));
    out.push_back(uint8_t(h >> 8));
    for (size_t i = b; i < b + 32; ++i) out.push_back(uint8_t(int8_t(std::lround(x[i] / d))));
  }
  *type = GgmlType::Q8_0;
  *bytes = out;
}

TEST(GgufCheckpointQ8, ReadsQuantizedMatrices) {
  TempDir dir;
  const std::string path = dir.str("qwen3moe-Q8_0.gguf");
  convert("qwen3moe", path, to_q8_0);
  const auto hf = Checkpoint::open(test::fixture_model("qwen3moe"));
  const auto gg = Checkpoint::open(path);
  EXPECT_EQ(gg->info().format_name, "gguf Q8_0/BF16");
  EXPECT_EQ(gg->weights().layers[1].ffn.router.format, MatrixFormat::Dense);
  const Matrix& gate = gg->weights().layers[1].ffn.experts[5].gate;
  EXPECT_EQ(gate.format, MatrixFormat::Gguf);
  EXPECT_EQ(gate.ggml, GgmlType::Q8_0);
  EXPECT_EQ(gate.bytes(), size_t(gate.rows * gate.cols / 32 * 34));
  // Each decoded weight is within half a quantization step of the original.
  const auto ma = matrices(hf->weights()), mb = matrices(gg->weights());
  for (size_t i = 0; i < ma.size(); ++i) {
    const std::vector<float> a = rows_of(*ma[i]), b = rows_of(*mb[i]);
    for (size_t j = 0; j < a.size(); j += 32) {
      float amax = 0;
      for (size_t k = j; k < j + 32; ++k) amax = std::max(amax, std::fabs(a[k]));
      for (size_t k = j; k < j + 32; ++k) ASSERT_LE(std::fabs(a[k] - b[k]), amax / 127.0f) << mb[i]->name;
    }
  }
  // The forward pass over Q8_0 rows is the forward pass over their decoded values, bit for bit.
  const std::string decoded = dir.str("qwen3moe-Q8_0-decoded.gguf");
  convert("qwen3moe", decoded, [](const std::string& name, GgmlType* type, std::vector<uint8_t>* bytes) {
    to_q8_0(name, type, bytes);
    if (*type != GgmlType::Q8_0) return;
    const int64_t n = int64_t(bytes->size()) / 34 * 32;
    std::vector<uint8_t> f32(size_t(n) * 4);
    ggml_dequantize_row(GgmlType::Q8_0, bytes->data(), n, reinterpret_cast<float*>(f32.data()));
    *type = GgmlType::F32;
    *bytes = f32;
  });
  const std::vector<int32_t> prompt = test::reference_prompt("qwen3moe");
  EXPECT_EQ(test::prompt_logits(*gg, prompt), test::prompt_logits(*Checkpoint::open(decoded), prompt));
}

// --------------------------------------------------------------------------------------- errors

TEST(GgufCheckpointErrors, UnknownArchitectureIsNamed) {
  TempDir dir;
  GgufWriter w;
  w.kv_string("general.architecture", "llama");
  w.write(dir.str("m.gguf"));
  EXPECT_EQ(open_error(dir.str("m.gguf")),
            dir.str("m.gguf") + ": unknown GGUF architecture 'llama' (metadata general.architecture; Petrel reads "
                                "qwen3, qwen3moe, qwen35, qwen35moe and qwen3next)");
}

TEST(GgufCheckpointErrors, MissingFileIsNamed) {
  TempDir dir;
  EXPECT_EQ(open_error(dir.str("model.gguf")), dir.str("model.gguf") + ": no such file (expected a GGUF file)");
}

TEST(GgufCheckpointErrors, MissingKeyIsNamed) {
  TempDir dir;
  GgufWriter w;
  w.kv_string("general.architecture", "qwen3");
  w.kv("qwen3.vocab_size", GgufType::U32, uint32_t(256));
  w.write(dir.str("m.gguf"));
  EXPECT_EQ(open_error(dir.str("m.gguf")),
            dir.str("m.gguf") + ": missing metadata key 'qwen3.embedding_length' (expected an unsigned integer)");
}

TEST(GgufCheckpointErrors, UnsupportedTypeNamesTensorAndType) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert("qwen3-dense-f32", path, [](const std::string& name, GgmlType* type, std::vector<uint8_t>* bytes) {
    if (name != "blk.1.ffn_up.weight") return;
    *type = GgmlType::Q8_1;  // 96 rows of 2 blocks of 40 bytes
    bytes->assign(96 * 2 * 40, 0);
  });
  EXPECT_EQ(open_error(path), path + ": tensor 'blk.1.ffn_up.weight' (layer 1 mlp up_proj) has type Q8_1, which "
                                     "Petrel does not decode (it decodes " + ggml_dequantized_type_list() + ")");
}

// The metadata of a one-layer qwen3 of width 4 and vocabulary 8, with no tensors yet.
GgufWriter tiny_qwen3_metadata() {
  GgufWriter w;
  w.kv_string("general.architecture", "qwen3");
  w.kv_strings("tokenizer.ggml.tokens", std::vector<std::string>(8, "x"));
  for (auto [k, v] : std::vector<std::pair<const char*, uint32_t>>{{"embedding_length", 4},
                                                                   {"block_count", 1},
                                                                   {"attention.head_count", 1},
                                                                   {"feed_forward_length", 8}})
    w.kv(std::string("qwen3.") + k, GgufType::U32, v);
  return w;
}

TEST(GgufCheckpointErrors, WrongShapeNamesFoundAndExpected) {
  TempDir dir;
  GgufWriter w = tiny_qwen3_metadata();
  w.tensor("token_embd.weight", GgmlType::F32, {8, 4}, std::vector<uint8_t>(128));
  w.write(dir.str("m.gguf"));
  EXPECT_EQ(open_error(dir.str("m.gguf")),
            dir.str("m.gguf") + ": tensor 'token_embd.weight' (token embedding) has shape {8, 4}, expected {4, 8} "
                                "(ggml order: the row length first)");
}

TEST(GgufCheckpointErrors, MissingTensorIsNamedWithItsRole) {
  TempDir dir;
  GgufWriter w = tiny_qwen3_metadata();
  w.tensor("token_embd.weight", GgmlType::F32, {4, 8}, std::vector<uint8_t>(128));
  w.write(dir.str("m.gguf"));
  EXPECT_EQ(open_error(dir.str("m.gguf")),
            dir.str("m.gguf") + ": missing tensor 'blk.0.attn_norm.weight' (layer 0 input_layernorm)");
}

TEST(GgufCheckpointCli, InspectReadsAGgufFile) {
  TempDir dir;
  convert("qwen3moe", dir.str("qwen3moe.gguf"));
  const auto r = test::run_petrel("inspect " + dir.str("qwen3moe.gguf"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_HAS(r.out, "architecture     qwen3_moe\n");
  EXPECT_HAS(r.out, "format           gguf BF16\n");
  EXPECT_HAS(r.out, "moe              6 experts, top 2, width 32");
}

}  // namespace
}  // namespace petrel
