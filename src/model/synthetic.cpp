#include "model/synthetic.h"

#include "core/error.h"
#include "model/fp8_quantize.h"

namespace petrel {
namespace {

ModelConfig hybrid_moe(Arch arch, int layers, int vocab, int experts, int top_k) {
  ModelConfig c;
  c.arch = arch;
  c.vocab = vocab;
  c.hidden = 2048;
  c.n_layers = layers;
  c.n_heads = 16;
  c.n_kv_heads = 2;
  c.head_dim = 256;
  c.attn_output_gate = true;
  c.rotary_dim = 64;
  c.rope_theta = 1e7f;
  c.lin_k_heads = 16;
  c.lin_v_heads = 32;
  c.lin_k_dim = 128;
  c.lin_v_dim = 128;
  c.conv_kernel = 4;
  c.n_experts = experts;
  c.top_k = top_k;
  c.moe_intermediate = 512;
  c.shared_intermediate = 512;
  c.max_position = 262144;
  for (int i = 0; i < layers; ++i)
    c.layer_kinds.push_back((i + 1) % 4 == 0 ? LayerKind::FullAttention : LayerKind::DeltaNet);
  c.layer_is_moe.assign(layers, true);
  c.mtp_layers = 1;  // both ship a one-layer multi-token prediction head
  return c;
}

Matrix shape(const std::string& name, int64_t rows, int64_t cols) {
  Matrix m;
  m.name = name;
  m.rows = rows;
  m.cols = cols;
  m.dtype = DType::BF16;
  return m;
}

MlpWeights mlp(const std::string& name, int64_t hidden, int64_t inter) {
  return {shape(name + ".gate_proj", inter, hidden), shape(name + ".up_proj", inter, hidden),
          shape(name + ".down_proj", hidden, inter)};
}

LayerWeights layer(const ModelConfig& c, LayerKind kind, bool moe, const std::string& p) {
  const int64_t H = c.hidden;
  LayerWeights L;
  L.kind = kind;
  L.input_norm.assign(H, 1.0f);
  L.post_norm.assign(H, 1.0f);
  if (L.kind == LayerKind::FullAttention) {
    const int64_t q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
    L.attn.q = shape(p + "q", q, H);
    if (c.attn_output_gate) L.attn.gate = shape(p + "gate", q, H);
    L.attn.k = shape(p + "k", kv, H);
    L.attn.v = shape(p + "v", kv, H);
    L.attn.o = shape(p + "o", H, q);
    L.attn.q_norm.assign(c.head_dim, 1.0f);
    L.attn.k_norm.assign(c.head_dim, 1.0f);
  } else {
    DeltaNetWeights& G = L.gdn;
    G.qkv = shape(p + "in_proj_qkv", c.gdn_conv_channels(), H);
    G.z = shape(p + "in_proj_z", c.gdn_value_dim(), H);
    G.b = shape(p + "in_proj_b", c.lin_v_heads, H);
    G.a = shape(p + "in_proj_a", c.lin_v_heads, H);
    G.out = shape(p + "out_proj", H, c.gdn_value_dim());
    G.conv.assign(size_t(c.gdn_conv_channels()) * c.conv_kernel, 0.25f);
    G.A_log.assign(c.lin_v_heads, 0.5f);
    G.dt_bias.assign(c.lin_v_heads, 0.0f);
    G.norm.assign(c.lin_v_dim, 1.0f);
  }
  FfnWeights& F = L.ffn;
  F.moe = moe;
  if (!F.moe) {
    F.dense = mlp(p + "mlp", H, c.intermediate);
    return L;
  }
  F.router = shape(p + "router", c.n_experts, H);
  for (int e = 0; e < c.n_experts; ++e) F.experts.push_back(mlp(p + "expert" + std::to_string(e), H, c.moe_intermediate));
  F.has_shared = c.shared_intermediate > 0;
  if (F.has_shared) {
    F.shared = mlp(p + "shared", H, c.shared_intermediate);
    F.shared_gate = shape(p + "shared_gate", 1, H);
  }
  return L;
}

}  // namespace

std::vector<std::string> synthetic_names() { return {"qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "qwen3-30b-a3b"}; }

ModelConfig synthetic_config(const std::string& name) {
  if (name == "qwen3.5-35b-a3b") return hybrid_moe(Arch::Qwen3_5Moe, 40, 248320, 256, 8);
  if (name == "qwen3-next-80b-a3b") return hybrid_moe(Arch::Qwen3Next, 48, 151936, 512, 10);
  if (name == "qwen3-30b-a3b") {
    ModelConfig c;
    c.arch = Arch::Qwen3Moe;
    c.vocab = 151936;
    c.hidden = 2048;
    c.n_layers = 48;
    c.n_heads = 32;
    c.n_kv_heads = 4;
    c.head_dim = 128;
    c.rotary_dim = 128;
    c.rope_theta = 1e6f;
    c.n_experts = 128;
    c.top_k = 8;
    c.moe_intermediate = 768;
    c.max_position = 40960;
    c.layer_kinds.assign(48, LayerKind::FullAttention);
    c.layer_is_moe.assign(48, true);
    return c;
  }
  std::string names;
  for (const auto& n : synthetic_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("--synthetic '" + name + "' is not a known shape (expected one of: " + names + ")");
}

std::unique_ptr<ModelWeights> synthetic_weights(const ModelConfig& c) {
  auto w = std::make_unique<ModelWeights>();
  const int64_t H = c.hidden;
  w->embed = shape("embed_tokens", c.vocab, H);
  w->lm_head = shape("lm_head", c.vocab, H);
  w->final_norm.assign(H, 1.0f);
  for (int i = 0; i < c.n_layers; ++i)
    w->layers.push_back(layer(c, c.layer_kinds[i], c.layer_is_moe[i], "layers." + std::to_string(i) + "."));
  if (c.mtp_layers == 0) return w;
  MtpWeights& M = w->mtp;
  M.embed_norm.assign(H, 1.0f);
  M.hidden_norm.assign(H, 1.0f);
  M.norm.assign(H, 1.0f);
  M.fc = shape("mtp.fc", H, 2 * H);
  for (int j = 0; j < c.mtp_layers; ++j)
    M.layers.push_back(layer(c, LayerKind::FullAttention, true, "mtp.layers." + std::to_string(j) + "."));
  return w;
}

}  // namespace petrel

namespace petrel {
namespace {

// llama.cpp's "more bits" layers of a Q4_K_M file: the first and last eighth and every third one
// between, whose attn_v and ffn_down take Q6_K.
bool more_bits(int layer, int layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

void set_type(Matrix& m, GgmlType t) {
  if (!m.valid()) return;
  m.format = MatrixFormat::Gguf;
  m.ggml = t;
}

void store_layer(LayerWeights& L, GgmlType base, GgmlType more) {
  for (Matrix* m : {&L.attn.q, &L.attn.gate, &L.attn.k, &L.attn.o, &L.gdn.qkv, &L.gdn.z, &L.gdn.b, &L.gdn.a,
                    &L.gdn.out, &L.ffn.dense.gate, &L.ffn.dense.up, &L.ffn.shared.gate, &L.ffn.shared.up})
    set_type(*m, base);
  set_type(L.attn.v, more);
  set_type(L.ffn.dense.down, more);
  set_type(L.ffn.shared.down, more);
  for (MlpWeights& e : L.ffn.experts) {
    set_type(e.gate, base);
    set_type(e.up, base);
    set_type(e.down, more);
  }
}

}  // namespace

std::vector<std::string> synthetic_gguf_mixes() { return {"q4_0", "q4_k_m"}; }

void store_as_gguf_mix(ModelWeights& w, const std::string& mix) {
  check(mix == "q4_0" || mix == "q4_k_m", "GGUF mix '" + mix + "' is not known (expected q4_0 or q4_k_m)");
  const bool k = mix == "q4_k_m";
  const GgmlType base = k ? GgmlType::Q4_K : GgmlType::Q4_0;
  set_type(w.embed, base);
  set_type(w.lm_head, GgmlType::Q6_K);  // both mixes keep the output matrix at 6 bits
  set_type(w.mtp.fc, base);
  const int n = int(w.layers.size());
  for (int i = 0; i < n; ++i) store_layer(w.layers[size_t(i)], base, k && more_bits(i, n) ? GgmlType::Q6_K : base);
  for (LayerWeights& L : w.mtp.layers) store_layer(L, base, base);
}

void store_as_fp8(ModelWeights& w) {
  for_each_fp8_matrix(w, [](Matrix& m) {
    if (!m.valid()) return;
    m.format = MatrixFormat::Fp8;
    m.dtype = DType::F32;
    m.fp8 = Fp8Blocks{128, 128, m.rows, 0};
  });
}

}  // namespace petrel
