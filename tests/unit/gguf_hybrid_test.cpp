// GGUF checkpoints of the hybrid architectures (qwen35moe, qwen35, qwen3next): the safetensors
// fixtures converted here as llama.cpp's converter converts them (conversion/qwen.py
// Qwen3NextModel, _LinearAttentionVReorderBase, _Qwen35MtpMixin; Qwen2MoeModel's experts), with
// every transform applied, open into the same config and give the safetensors run's logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "gguf_writer.h"
#include "checkpoint_logits.h"
#include "io/checkpoint.h"
#include "open_error.h"
#include "test_util.h"

namespace petrel {
namespace {

using nlohmann::json;
using test::GgufWriter;
using test::TempDir;

// A tensor in PyTorch dim order, as floats (the fixtures' BF16 values are exact in f32).
struct T {
  std::vector<int64_t> shape;
  std::vector<float> v;
  int64_t rows() const { return shape[0]; }
  int64_t row_len() const { return int64_t(v.size()) / shape[0]; }
};

T to_t(const test::RawTensor& r) {
  T t{r.shape, std::vector<float>(r.bytes.size() / (r.dtype == "F32" ? 4 : 2))};
  convert_to_f32(r.bytes.data(), r.dtype == "F32" ? DType::F32 : DType::BF16, t.v.size(), t.v.data());
  return t;
}

// Rows [first, first + n·r·head) hold n·r heads of `head` rows, grouped per key head (j = g·r + m);
// _reorder_v_heads moves head j to tiled position m·n + g.
void reorder_v_rows(T& t, int64_t first, int64_t n, int64_t r, int64_t head) {
  const T old = t;
  const int64_t len = t.row_len();
  for (int64_t j = 0; j < n * r; ++j)
    for (int64_t d = 0; d < head; ++d) {
      const int64_t to = first + ((j % r) * n + j / r) * head + d, from = first + j * head + d;
      std::copy_n(old.v.begin() + from * len, len, t.v.begin() + to * len);
    }
}

// The same on the columns of a 2-D tensor (out_proj's input dim).
void reorder_v_cols(T& t, int64_t n, int64_t r, int64_t head) {
  const T old = t;
  const int64_t len = t.row_len();
  for (int64_t row = 0; row < t.rows(); ++row)
    for (int64_t j = 0; j < n * r; ++j)
      std::copy_n(old.v.begin() + row * len + j * head, head, t.v.begin() + row * len + ((j % r) * n + j / r) * head);
}

// Rows [begin, end) of t.
T rows(const T& t, int64_t begin, int64_t end) {
  T out{t.shape, {t.v.begin() + begin * t.row_len(), t.v.begin() + end * t.row_len()}};
  out.shape[0] = end - begin;
  return out;
}

std::vector<uint8_t> encode(const std::vector<float>& v, GgmlType type) {
  std::vector<uint8_t> b(v.size() * (type == GgmlType::F32 ? 4 : 2));
  if (type == GgmlType::F32) {
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    const uint16_t h = uint16_t(bits >> 16);  // exact: every value came from BF16
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

struct Converter {
  json cfg;
  std::string arch;
  int64_t Hk, Hv, dk, dv, n_layers;
  GgufWriter w;
  std::map<std::string, std::vector<T>> stacks;  // per-expert tensors, stacked as Qwen2MoeModel does

  // The converter turns every tensor to f32, then stores 1-D tensors, norms, routers, the shared
  // gate and conv1d as F32 and the rest in the output type (here BF16, the fixtures' own).
  void put(const std::string& name, const T& t) {
    const bool f32 = t.shape.size() == 1 || name.find("_norm.weight") != std::string::npos ||
                     name.find("ffn_gate_inp") != std::string::npos || name.find("ssm_conv1d") != std::string::npos;
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    w.tensor(name, f32 ? GgmlType::F32 : GgmlType::BF16, ne, encode(t.v, f32 ? GgmlType::F32 : GgmlType::BF16));
  }

  // TextModel.filter_tensors drops "language_model." and the vision tower; _Qwen35MtpMixin moves
  // mtp.layers.j.* to the block after the trunk's layers and renames the head's own tensors there.
  std::string hf_name(std::string name) const {
    const std::string lm = "language_model.";
    if (auto at = name.find(lm); at != std::string::npos) name.erase(at, lm.size());
    const std::string block = "model.layers." + std::to_string(n_layers) + ".";
    static const std::pair<const char*, const char*> kHead[] = {{"mtp.fc.", "eh_proj."},
                                                                {"mtp.pre_fc_norm_embedding.", "enorm."},
                                                                {"mtp.pre_fc_norm_hidden.", "hnorm."},
                                                                {"mtp.norm.", "shared_head.norm."}};
    for (const auto& [from, to] : kHead)
      if (name.rfind(from, 0) == 0) return block + to + name.substr(std::strlen(from));
    std::smatch m;
    if (std::regex_match(name, m, std::regex(R"(^mtp\.layers\.(\d+)\.(.*)$)")))
      return "model.layers." + std::to_string(n_layers + std::stoi(m[1].str())) + "." + m[2].str();
    return name;
  }

  // gguf-py tensor_mapping.py names for the hybrids.
  std::string gguf_name(const std::string& hf) const {
    static const std::pair<std::regex, const char*> kRenames[] = {
        {std::regex(R"(^model\.embed_tokens\.weight$)"), "token_embd.weight"},
        {std::regex(R"(^lm_head\.weight$)"), "output.weight"},
        {std::regex(R"(^model\.norm\.weight$)"), "output_norm.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.input_layernorm\.weight$)"), "blk.$1.attn_norm.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.post_attention_layernorm\.weight$)"), "blk.$1.post_attention_norm.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.self_attn\.o_proj\.weight$)"), "blk.$1.attn_output.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.weight$)"), "blk.$1.attn_$2.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.self_attn\.(q|k)_norm\.weight$)"), "blk.$1.attn_$2_norm.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.mlp\.gate\.weight$)"), "blk.$1.ffn_gate_inp.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight$)"), "blk.$1.ffn_$2.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.mlp\.shared_expert\.(gate|up|down)_proj\.weight$)"),
         "blk.$1.ffn_$2_shexp.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.mlp\.shared_expert_gate\.weight$)"), "blk.$1.ffn_gate_inp_shexp.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.in_proj_qkv\.weight$)"), "blk.$1.attn_qkv.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.in_proj_z\.weight$)"), "blk.$1.attn_gate.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.in_proj_b\.weight$)"), "blk.$1.ssm_beta.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.in_proj_a\.weight$)"), "blk.$1.ssm_alpha.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.in_proj_ba\.weight$)"), "blk.$1.ssm_ba.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.conv1d\.weight$)"), "blk.$1.ssm_conv1d.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.dt_bias$)"), "blk.$1.ssm_dt.bias"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.A_log$)"), "blk.$1.ssm_a"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.norm\.weight$)"), "blk.$1.ssm_norm.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.out_proj\.weight$)"), "blk.$1.ssm_out.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.eh_proj\.weight$)"), "blk.$1.nextn.eh_proj.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.(e|h)norm\.weight$)"), "blk.$1.nextn.$2norm.weight"},
        {std::regex(R"(^model\.layers\.(\d+)\.shared_head\.norm\.weight$)"), "blk.$1.nextn.shared_head_norm.weight"},
    };
    for (const auto& [re, to] : kRenames)
      if (std::regex_match(hf, re)) return std::regex_replace(hf, re, to);
    ADD_FAILURE() << "no GGUF name for " << hf;
    return hf;
  }

  // _LinearAttentionVReorderBase.modify_tensors (qwen35*, and only when Hk != Hv).
  void reorder_v_heads(const std::string& name, T& t) const {
    if (arch == "qwen3next" || Hk == Hv || name.find("linear_attn.") == std::string::npos) return;
    const int64_t r = Hv / Hk;
    if (name.find(".in_proj_qkv.") != std::string::npos) reorder_v_rows(t, 2 * Hk * dk, Hk, r, dv);
    else if (name.find(".in_proj_z.") != std::string::npos) reorder_v_rows(t, 0, Hk, r, dv);
    else if (name.find(".in_proj_b.") != std::string::npos || name.find(".in_proj_a.") != std::string::npos)
      reorder_v_rows(t, 0, Hk, r, 1);
    else if (name.find(".A_log") != std::string::npos || name.find(".dt_bias") != std::string::npos)
      reorder_v_rows(t, 0, Hk, r, 1);
    else if (name.find(".conv1d") != std::string::npos) reorder_v_rows(t, 2 * Hk * dk, Hk, r, dv);
    else if (name.find(".out_proj.") != std::string::npos) reorder_v_cols(t, Hk, r, dv);
  }

  // Qwen3NextModel.modify_tensors, then Qwen2MoeModel's expert handling, then the renames.
  void add(const std::string& name, T t) {
    reorder_v_heads(name, t);
    const auto ends = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends(".A_log")) {
      for (float& x : t.v) x = -std::exp(x);
    } else if (name.find("conv1d") != std::string::npos) {
      t.shape = {t.shape[0], t.shape[2]};  // squeeze [C, 1, K]
    } else if (ends("norm.weight") && !ends("linear_attn.norm.weight")) {
      for (float& x : t.v) x += 1.0f;
    }
    std::smatch m;
    if (std::regex_match(name, m, std::regex(R"(^model\.layers\.(\d+)\.linear_attn\.in_proj_qkvz\.weight$)")))
      return add_qkvz(m[1].str(), t);
    if (std::regex_match(name, m, std::regex(R"(^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$)")))
      return add_fused_experts(m[1].str(), m[2].str(), t);
    if (std::regex_match(name, m, std::regex(R"(^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)_proj\.weight$)"))) {
      auto& stack = stacks["blk." + m[1].str() + ".ffn_" + m[3].str() + "_exps.weight"];
      const size_t e = std::stoul(m[2].str());
      if (stack.size() <= e) stack.resize(e + 1);
      stack[e] = t;
      return;
    }
    put(gguf_name(name), t);
  }

  // [q_g | k_g | v_g | z_g] per key head g -> attn_qkv = [q | k | v] and attn_gate = z.
  void add_qkvz(const std::string& layer, const T& t) {
    const int64_t r = Hv / Hk, P = 2 * dk + 2 * r * dv, H = t.row_len();
    T qkv{{2 * Hk * dk + Hv * dv, H}, {}}, z{{Hv * dv, H}, {}};
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t g = 0; g < Hk; ++g) {
        const int64_t begin = g * P + (part < 2 ? part * dk : 2 * dk), len = part < 2 ? dk : r * dv;
        const T piece = rows(t, begin, begin + len);
        qkv.v.insert(qkv.v.end(), piece.v.begin(), piece.v.end());
      }
    for (int64_t g = 0; g < Hk; ++g) {
      const T piece = rows(t, g * P + 2 * dk + r * dv, (g + 1) * P);
      z.v.insert(z.v.end(), piece.v.begin(), piece.v.end());
    }
    put("blk." + layer + ".attn_qkv.weight", qkv);
    put("blk." + layer + ".attn_gate.weight", z);
  }

  // Fused gate_up_proj [E, 2I, H] splits on dim -2 into gate and up; down_proj stays [E, H, I].
  void add_fused_experts(const std::string& layer, const std::string& part, const T& t) {
    if (part == "down_proj") return put("blk." + layer + ".ffn_down_exps.weight", t);
    const int64_t E = t.shape[0], I2 = t.shape[1], H = t.shape[2];
    T gate{{E, I2 / 2, H}, {}}, up{{E, I2 / 2, H}, {}};
    for (int64_t e = 0; e < E; ++e) {
      const auto at = t.v.begin() + e * I2 * H;
      gate.v.insert(gate.v.end(), at, at + I2 / 2 * H);
      up.v.insert(up.v.end(), at + I2 / 2 * H, at + I2 * H);
    }
    put("blk." + layer + ".ffn_gate_exps.weight", gate);
    put("blk." + layer + ".ffn_up_exps.weight", up);
  }

  void flush_stacks() {
    for (const auto& [name, stack] : stacks) {
      T t{{int64_t(stack.size()), stack[0].shape[0], stack[0].shape[1]}, {}};
      for (const T& e : stack) t.v.insert(t.v.end(), e.v.begin(), e.v.end());
      put(name, t);
    }
  }
};

// Qwen3NextModel.set_gguf_parameters and TextModel.set_gguf_parameters' keys for the fixture.
// mtp_layers: the head's blocks after the trunk's (nextn_predict_layers).
void write_metadata(Converter& c, int mtp_layers) {
  const json& t = c.cfg;
  GgufWriter& w = c.w;
  const std::string& a = c.arch;
  auto u32 = [&](const std::string& key, int64_t v) { w.kv(a + "." + key, GgufType::U32, uint32_t(v)); };
  w.kv_string("general.architecture", a);
  u32("block_count", c.n_layers + mtp_layers);
  if (mtp_layers > 0) u32("nextn_predict_layers", mtp_layers);
  u32("context_length", t["max_position_embeddings"]);
  u32("embedding_length", t["hidden_size"]);
  if (t.contains("intermediate_size")) u32("feed_forward_length", t["intermediate_size"]);
  u32("attention.head_count", t["num_attention_heads"]);
  u32("attention.head_count_kv", t["num_key_value_heads"]);
  u32("attention.key_length", t["head_dim"]);
  u32("attention.value_length", t["head_dim"]);
  w.kv(a + ".attention.layer_norm_rms_epsilon", GgufType::F32, t["rms_norm_eps"].get<float>());
  w.kv(a + ".rope.freq_base", GgufType::F32, t["rope_parameters"]["rope_theta"].get<float>());
  if (t.contains("num_experts")) {
    u32("expert_count", t["num_experts"]);
    u32("expert_used_count", t["num_experts_per_tok"]);
    u32("expert_feed_forward_length", t["moe_intermediate_size"]);
    u32("expert_shared_feed_forward_length", t["shared_expert_intermediate_size"]);
  }
  u32("ssm.conv_kernel", t["linear_conv_kernel_dim"]);
  u32("ssm.state_size", c.dk);
  u32("ssm.group_count", c.Hk);
  u32("ssm.time_step_rank", c.Hv);
  u32("ssm.inner_size", c.Hv * c.dv);
  u32("full_attention_interval", t.value("full_attention_interval", 4));  // the converter's default
  u32("rope.dimension_count", int64_t(t["head_dim"].get<int>() * t["partial_rotary_factor"].get<double>()));
  if (a != "qwen3next") w.kv_array(a + ".rope.dimension_sections", GgufType::I32, std::vector<int32_t>{2, 1, 1, 0});
  w.kv_strings("tokenizer.ggml.tokens", std::vector<std::string>(t["vocab_size"].get<size_t>(), "x"));
}

// claimed_mtp_layers > 0: the metadata claims that many head layers whatever the tensors hold.
void convert(const std::string& fixture, const std::string& path, int claimed_mtp_layers = 0) {
  const std::string dir = test::fixture_model(fixture);
  const json root = json::parse(std::ifstream(dir + "/config.json"));
  Converter c;
  c.cfg = root.contains("text_config") ? root["text_config"] : root;
  const std::string type = c.cfg["model_type"];
  c.arch = type == "qwen3_next" ? "qwen3next" : type == "qwen3_5_text" ? "qwen35" : "qwen35moe";
  c.Hk = c.cfg["linear_num_key_heads"], c.Hv = c.cfg["linear_num_value_heads"];
  c.dk = c.cfg["linear_key_head_dim"], c.dv = c.cfg["linear_value_head_dim"];
  c.n_layers = c.cfg["num_hidden_layers"];
  std::map<std::string, test::RawTensor> all;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".safetensors")
      for (auto& [name, t] : test::read_all(entry.path().string())) all[name] = t;
  bool mtp = false;
  for (const auto& [raw, t] : all) {
    if (raw.rfind("mtp.", 0) == 0) {
      // Qwen3NextModel.filter_tensors drops mtp.*; a Qwen3.5 config without mtp_num_hidden_layers
      // has no head block to hold them, and is converted with --no-mtp (make_converter_fixtures.py).
      if (c.arch == "qwen3next" || !c.cfg.contains("mtp_num_hidden_layers")) continue;
      mtp = true;
    }
    const std::string name = c.hf_name(raw);
    if (name.rfind("model.visual.", 0) == 0) continue;
    c.add(name, to_t(t));
  }
  c.flush_stacks();
  write_metadata(c, claimed_mtp_layers > 0 ? claimed_mtp_layers : mtp ? 1 : 0);
  c.w.write(path);
}

class GgufHybrid : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufHybrid, GivesTheSafetensorsLogits) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert(GetParam(), path);
  const auto hf = Checkpoint::open(test::fixture_model(GetParam()));
  const auto gg = Checkpoint::open(path);
  const ModelConfig &a = hf->config(), &b = gg->config();
  EXPECT_EQ(b.arch, a.arch);
  EXPECT_EQ(b.n_layers, a.n_layers);
  EXPECT_EQ(b.layer_kinds, a.layer_kinds);
  EXPECT_EQ(b.layer_is_moe, a.layer_is_moe);
  EXPECT_EQ(b.attn_output_gate, a.attn_output_gate);
  EXPECT_EQ(b.rotary_dim, a.rotary_dim);
  EXPECT_EQ(b.lin_k_heads, a.lin_k_heads);
  EXPECT_EQ(b.lin_v_heads, a.lin_v_heads);
  EXPECT_EQ(b.lin_k_dim, a.lin_k_dim);
  EXPECT_EQ(b.lin_v_dim, a.lin_v_dim);
  EXPECT_EQ(b.conv_kernel, a.conv_kernel);
  EXPECT_EQ(b.shared_intermediate, a.shared_intermediate);
  // config.json's intermediate_size of an all-MoE model is unused; the converter writes it anyway.
  if (std::count(a.layer_is_moe.begin(), a.layer_is_moe.end(), false) > 0) EXPECT_EQ(b.intermediate, a.intermediate);
  EXPECT_EQ(b.norm_topk_prob, a.norm_topk_prob);
  EXPECT_EQ(gg->info().parameters, hf->info().parameters);
  for (size_t i = 0; i < a.layer_kinds.size(); ++i) {
    const LayerWeights &la = hf->weights().layers[i], &lb = gg->weights().layers[i];
    EXPECT_EQ(lb.input_norm, la.input_norm) << i;
    EXPECT_EQ(lb.post_norm, la.post_norm) << i;
    if (la.kind != LayerKind::DeltaNet) continue;
    EXPECT_EQ(lb.gdn.conv, la.gdn.conv) << i;
    EXPECT_EQ(lb.gdn.dt_bias, la.gdn.dt_bias) << i;
    EXPECT_EQ(lb.gdn.norm, la.gdn.norm) << i;
    for (size_t h = 0; h < la.gdn.A_log.size(); ++h) EXPECT_NEAR(lb.gdn.A_log[h], la.gdn.A_log[h], 1e-6) << i;
  }

  const std::vector<int32_t> prompt = test::reference_prompt(GetParam());
  test::expect_logits_within(test::prompt_logits(*hf, prompt), test::prompt_logits(*gg, prompt), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufHybrid,
                         ::testing::Values("qwen35moe-vlm-fused", "qwen35moe-text-per-expert", "qwen35-dense",
                                           "qwen3next-sharded", "qwen35moe-mtp"),
                         [](const auto& info) { return test::param_name(info.param); });

// The head's logits after the trunk's prompt (row t: h_t and prompt token t+1), as
// speculative_mtp_test computes them.
std::vector<float> mtp_logits(const Checkpoint& ck, const std::vector<int32_t>& ids) {
  CpuBackend backend{CpuOptions{1}};
  Model model(ck.config(), ck.weights(), backend, ForwardOptions{});
  const int T = int(ids.size());
  auto st = model.new_sequence(T);
  model.forward(ids.data(), T, *st, nullptr);
  auto mtp = model.new_mtp_sequence(T);
  std::vector<float> logits(size_t(T - 1) * size_t(ck.config().vocab));
  model.mtp_forward(ids.data() + 1, T - 1, /*from_trunk=*/true, *mtp, logits.data());
  return logits;
}

// Qwen3.5's multi-token prediction head, as _Qwen35MtpMixin writes it (an extra block with
// nextn.* tensors), loads into the same head: the same norms and the same draft logits.
TEST(GgufHybridMtp, LoadsTheHeadAsTheSafetensorsDo) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert("qwen35moe-mtp", path);
  const auto hf = Checkpoint::open(test::fixture_model("qwen35moe-mtp"));
  const auto gg = Checkpoint::open(path);
  ASSERT_EQ(gg->config().mtp_layers, 1);
  EXPECT_EQ(gg->config().n_layers, hf->config().n_layers);
  const MtpWeights &a = hf->weights().mtp, &b = gg->weights().mtp;
  ASSERT_EQ(b.layers.size(), 1u);
  EXPECT_EQ(b.embed_norm, a.embed_norm);
  EXPECT_EQ(b.hidden_norm, a.hidden_norm);
  EXPECT_EQ(b.norm, a.norm);
  EXPECT_EQ(b.layers[0].input_norm, a.layers[0].input_norm);
  for (const std::string& name : gg->info().skipped) EXPECT_EQ(name.find("nextn"), std::string::npos) << name;
  const std::vector<int32_t> prompt = test::reference_prompt("qwen35moe-mtp");
  test::expect_logits_within(mtp_logits(*hf, prompt), mtp_logits(*gg, prompt), 1e-5f);
}

TEST(GgufHybridMtp, DeeperHeadsAreRefusedByName) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert("qwen35moe-mtp", path, /*claimed_mtp_layers=*/2);
  const std::string msg = test::open_error(path);
  EXPECT_NE(msg.find(path + ": metadata key 'qwen35moe.nextn_predict_layers' is 2: multi-token prediction heads of "
                            "more than one layer are not supported"),
            std::string::npos)
      << msg;
}

TEST(GgufHybridErrors, PositiveSsmAIsNamed) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert("qwen35-dense", path);
  // Flip layer 0's ssm_a to +exp(A_log): a file whose A was stored without the converter's sign.
  size_t at = 0;
  {
    const GgufFile file(path);
    for (const auto& t : file.tensors())
      if (t.name == "blk.0.ssm_a") at = file.data_offset() + t.offset;
  }
  ASSERT_NE(at, 0u);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  float v;
  f.seekg(std::streamoff(at));
  f.read(reinterpret_cast<char*>(&v), 4);
  v = -v;
  f.seekp(std::streamoff(at));
  f.write(reinterpret_cast<const char*>(&v), 4);
  f.close();
  const std::string msg = test::open_error(path);
  EXPECT_NE(msg.find(path + ": tensor 'blk.0.ssm_a' holds "), std::string::npos) << msg;
  EXPECT_NE(msg.find("for value head 0, expected -exp(A_log) < 0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace petrel
