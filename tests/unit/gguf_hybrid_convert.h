// The hybrid architectures' safetensors folders (qwen35moe, qwen35, qwen3next) converted to GGUF
// as llama.cpp's converter converts them (conversion/qwen.py Qwen3NextModel,
// _LinearAttentionVReorderBase, _Qwen35MtpMixin; Qwen2MoeModel's experts), every transform applied.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/gguf_quants.h"
#include "gguf_writer.h"
#include "test_util.h"

namespace petrel::test::hybrid {

using nlohmann::json;

// How a test stores a matrix the converter would write as BF16: `type` and `bytes` (BF16 when
// called) may be replaced; `ne` is in ggml order and `v` holds the values.
using Encode = std::function<void(const std::string& name, const std::vector<uint64_t>& ne, const std::vector<float>& v,
                                  GgmlType* type, std::vector<uint8_t>* bytes)>;

// A tensor in PyTorch dim order, as floats (the fixtures' BF16 values are exact in f32).
struct T {
  std::vector<int64_t> shape;
  std::vector<float> v;
  int64_t rows() const { return shape[0]; }
  int64_t row_len() const { return int64_t(v.size()) / shape[0]; }
};

inline T to_t(const test::RawTensor& r) {
  T t{r.shape, std::vector<float>(r.bytes.size() / (r.dtype == "F32" ? 4 : 2))};
  convert_to_f32(r.bytes.data(), r.dtype == "F32" ? DType::F32 : DType::BF16, t.v.size(), t.v.data());
  return t;
}

// Rows [first, first + n·r·head) hold n·r heads of `head` rows, grouped per key head (j = g·r + m);
// _reorder_v_heads moves head j to tiled position m·n + g.
inline void reorder_v_rows(T& t, int64_t first, int64_t n, int64_t r, int64_t head) {
  const T old = t;
  const int64_t len = t.row_len();
  for (int64_t j = 0; j < n * r; ++j)
    for (int64_t d = 0; d < head; ++d) {
      const int64_t to = first + ((j % r) * n + j / r) * head + d, from = first + j * head + d;
      std::copy_n(old.v.begin() + from * len, len, t.v.begin() + to * len);
    }
}

// The same on the columns of a 2-D tensor (out_proj's input dim).
inline void reorder_v_cols(T& t, int64_t n, int64_t r, int64_t head) {
  const T old = t;
  const int64_t len = t.row_len();
  for (int64_t row = 0; row < t.rows(); ++row)
    for (int64_t j = 0; j < n * r; ++j)
      std::copy_n(old.v.begin() + row * len + j * head, head, t.v.begin() + row * len + ((j % r) * n + j / r) * head);
}

// Rows [begin, end) of t.
inline T rows(const T& t, int64_t begin, int64_t end) {
  T out{t.shape, {t.v.begin() + begin * t.row_len(), t.v.begin() + end * t.row_len()}};
  out.shape[0] = end - begin;
  return out;
}

inline std::vector<uint8_t> encode(const std::vector<float>& v, GgmlType type) {
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

  Encode encode_matrix;  // when set, sees every tensor stored as BF16

  // The converter turns every tensor to f32, then stores 1-D tensors, norms, routers, the shared
  // gate and conv1d as F32 and the rest in the output type (here BF16, the fixtures' own).
  void put(const std::string& name, const T& t) {
    const bool f32 = t.shape.size() == 1 || name.find("_norm.weight") != std::string::npos ||
                     name.find("ffn_gate_inp") != std::string::npos || name.find("ssm_conv1d") != std::string::npos;
    const std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    GgmlType type = f32 ? GgmlType::F32 : GgmlType::BF16;
    std::vector<uint8_t> bytes = encode(t.v, type);
    if (!f32 && encode_matrix) encode_matrix(name, ne, t.v, &type, &bytes);
    w.tensor(name, type, ne, bytes);
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
inline void write_metadata(Converter& c, int mtp_layers) {
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

// The safetensors folder `dir` as a GGUF file at `path`. claimed_mtp_layers > 0: the metadata
// claims that many head layers whatever the tensors hold.
inline void convert(const std::string& dir, const std::string& path, int claimed_mtp_layers = 0,
             const Encode& encode_matrix = {}) {
  const json root = json::parse(std::ifstream(dir + "/config.json"));
  Converter c;
  c.encode_matrix = encode_matrix;
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

}  // namespace petrel::test::hybrid
