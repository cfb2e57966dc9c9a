// A GGUF checkpoint's tensors -> canonical roles, undoing what llama.cpp's converter
// (convert_hf_to_gguf.py and its conversion/ modules) did to the Hugging Face tensors.
//
// - Names: TextModel.modify_tensors maps each HF name through gguf-py's tensor_mapping.py to the
//   arch's names in constants.py (MODEL_TENSORS[QWEN3], [QWEN3MOE], [QWEN35], [QWEN35MOE],
//   [QWEN3NEXT]): model.embed_tokens -> token_embd, lm_head -> output, model.norm -> output_norm,
//   layers.N -> blk.N, input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm (qwen3,
//   qwen3moe) or post_attention_norm (the hybrids), self_attn.{q,k,v,o}_proj ->
//   attn_{q,k,v,output}, self_attn.{q,k}_norm -> attn_{q,k}_norm, mlp.{gate,up,down}_proj ->
//   ffn_{gate,up,down}, mlp.gate -> ffn_gate_inp, mlp.shared_expert.* -> ffn_*_shexp,
//   mlp.shared_expert_gate -> ffn_gate_inp_shexp; linear_attn.{in_proj_qkv, in_proj_z, in_proj_b,
//   in_proj_a, in_proj_ba, conv1d, dt_proj.bias, A_log, norm, out_proj} -> attn_qkv, attn_gate,
//   ssm_beta, ssm_alpha, ssm_ba, ssm_conv1d, ssm_dt.bias, ssm_a, ssm_norm, ssm_out.
// - Dims: GGUF lists them in ggml order, the reverse of PyTorch's, so a PyTorch [out, in] weight
//   is {in, out} with rows of `in` elements: the same bytes as Petrel's [rows, cols] Matrix.
// - Experts: Qwen2MoeModel.modify_tensors stacks the per-expert tensors of a layer with
//   torch.stack(dim=0) into ffn_{gate,up}_exps {H, I, E} and ffn_down_exps {I, H, E}, and splits
//   a fused gate_up_proj into the same two; expert e is the e-th run of I (or H) rows.
// - Qwen3's RMSNorm weights are plain multipliers (not zero-centred), so no +1 is involved, and
//   Qwen RoPE is NeoX-style, so the converter does not permute q/k rows (LlamaModel's permute).
// - The hybrids' other transforms are undone in map_deltanet and map_attention, each rule naming
//   the converter code it undoes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/gguf_config.h"

namespace petrel {

class GgufWeightMapper {
 public:
  explicit GgufWeightMapper(Checkpoint& ck) : ck_(ck), c_(ck.config_), model_(*ck.gguf_) {}
  void run();

 private:
  const GgufTensor* find(const std::string& name) const { return model_.find(name); }
  const GgufTensor& tensor(const std::string& name, const std::string& role);
  // The tensor `name` of dims `ne` (ggml order) as a [prod(ne[1:]), ne[0]] matrix.
  Matrix matrix(const std::string& name, const std::vector<int64_t>& ne, const std::string& role);
  // The floats of tensor `name` of dims `ne`, or of a 1-D tensor of n.
  std::vector<float> values(const std::string& name, const std::vector<int64_t>& ne, const std::string& role);
  std::vector<float> vector(const std::string& name, int64_t n, const std::string& role) { return values(name, {n}, role); }
  // Where the DeltaNet tensors store Hugging Face value head j.
  int64_t stored_v_head(int64_t j) const;
  Matrix v_head_rows(const Matrix& m, int64_t first_row, int64_t head_rows) const;
  Matrix v_head_columns(const Matrix& m, int64_t head_cols);
  void map_attention(const std::string& p, const std::string& layer, LayerWeights& L);
  void map_deltanet(const std::string& p, const std::string& layer, LayerWeights& L);
  void map_ffn(bool moe, const std::string& p, const std::string& layer, FfnWeights& F);
  MlpWeights mlp(const std::string& p, const std::string& suffix, int64_t I, const std::string& role);
  void map_layer(const std::string& p, const std::string& layer, LayerKind kind, bool moe, LayerWeights& L);
  void map_mtp();

  Checkpoint& ck_;
  const ModelConfig& c_;
  const GgufModel& model_;
  std::set<std::string> used_;
  std::map<GgmlType, size_t> matrix_bytes_;  // per type, for the format name
};

const GgufTensor& GgufWeightMapper::tensor(const std::string& name, const std::string& role) {
  const GgufTensor* t = find(name);
  check(t != nullptr, model_.path() + ": missing tensor '" + name + "' (" + role + ")");
  used_.insert(name);
  return *t;
}

static std::string ne_str(const std::vector<int64_t>& ne) {
  GgufTensor t;
  t.ne = ne;
  return t.shape_str();
}

// A tensor's type must be one Petrel decodes.
static void check_decoded(const GgufTensor& t, const std::string& role) {
  check(ggml_type_info(t.type).dequantized,
        t.file + ": tensor '" + t.name + "' (" + role + ") has type " + ggml_type_name(t.type) +
            ", which Petrel does not decode (it decodes " + ggml_dequantized_type_list() + ")");
}

Matrix GgufWeightMapper::matrix(const std::string& name, const std::vector<int64_t>& ne, const std::string& role) {
  const GgufTensor& t = tensor(name, role);
  check(t.ne == ne, t.file + ": tensor '" + name + "' (" + role + ") has shape " + t.shape_str() + ", expected " +
                        ne_str(ne) + " (ggml order: the row length first)");
  check_decoded(t, role);
  Matrix m;
  m.name = name;
  m.cols = t.row_length();
  m.rows = t.rows();
  m.data = t.data;
  switch (t.type) {
    case GgmlType::F32: m.dtype = DType::F32; break;
    case GgmlType::F16: m.dtype = DType::F16; break;
    case GgmlType::BF16: m.dtype = DType::BF16; break;
    default:
      m.format = MatrixFormat::Gguf;
      m.ggml = t.type;
  }
  matrix_bytes_[t.type] += t.nbytes;
  return m;
}

std::vector<float> GgufWeightMapper::values(const std::string& name, const std::vector<int64_t>& ne,
                                            const std::string& role) {
  const GgufTensor& t = tensor(name, role);
  check(t.ne == ne, t.file + ": tensor '" + name + "' (" + role + ") has shape " + t.shape_str() + ", expected " +
                        ne_str(ne));
  check_decoded(t, role);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ggml_dequantize_row(t.type, t.data, t.numel(), v.data());
  return v;
}

// Logical row i of the result reads stored row rows[i] of `m`.
static Matrix gather(const Matrix& m, std::vector<int32_t> rows) {
  Matrix out = m;
  out.rows = int64_t(rows.size());
  out.row_map = std::make_shared<const std::vector<int32_t>>(std::move(rows));
  return out;
}

// _LinearAttentionVReorderBase (Qwen3.5 files only) moves value heads from Hugging Face's order,
// grouped by key head (j = g·r + m), to ggml's tiled order (p = m·Hk + g) in every tensor that
// has one: _reorder_v_heads on in_proj_qkv's V rows, in_proj_z, in_proj_b/a, A_log, dt_bias,
// conv1d's V channels and out_proj's columns. Qwen3NextModel does not reorder.
int64_t GgufWeightMapper::stored_v_head(int64_t j) const {
  if (c_.arch == Arch::Qwen3Next) return j;
  const int64_t Hk = c_.lin_k_heads, r = c_.lin_v_heads / c_.lin_k_heads;
  return (j % r) * Hk + j / r;
}

// `m` with its value-head rows (from `first_row`, `head_rows` per head) back in Hugging Face order.
Matrix GgufWeightMapper::v_head_rows(const Matrix& m, int64_t first_row, int64_t head_rows) const {
  std::vector<int32_t> rows(static_cast<size_t>(m.rows));
  for (int64_t r = 0; r < first_row; ++r) rows[r] = int32_t(r);
  for (int64_t j = 0; j < c_.lin_v_heads; ++j)
    for (int64_t d = 0; d < head_rows; ++d)
      rows[first_row + j * head_rows + d] = int32_t(first_row + stored_v_head(j) * head_rows + d);
  return gather(m, std::move(rows));
}

// `m` with its columns (`head_cols` per value head) back in Hugging Face order. A matrix reads its
// rows in place, so this one is rewritten: whole blocks move when a head spans whole blocks of its
// type, otherwise the rows are decoded to f32 first.
Matrix GgufWeightMapper::v_head_columns(const Matrix& m, int64_t head_cols) {
  const GgmlType type = m.format == MatrixFormat::Gguf ? m.ggml
                        : m.dtype == DType::F32        ? GgmlType::F32
                        : m.dtype == DType::F16        ? GgmlType::F16
                                                       : GgmlType::BF16;
  const GgmlTypeInfo& info = ggml_type_info(type);
  const bool whole_blocks = head_cols % info.block == 0;
  const int64_t head_bytes = whole_blocks ? head_cols / info.block * info.bytes : head_cols * 4;
  const int64_t row_bytes = head_bytes * c_.lin_v_heads;
  std::vector<uint8_t>& out = ck_.rewritten_.emplace_back(size_t(m.rows * row_bytes));
  std::vector<float> decoded(whole_blocks ? 0 : size_t(m.cols));
  const auto* in = static_cast<const uint8_t*>(m.data);
  for (int64_t r = 0; r < m.rows; ++r) {
    const uint8_t* row = in + r * ggml_row_bytes(type, m.cols);
    if (!whole_blocks) {
      m.dequant_row(r, decoded.data());
      row = reinterpret_cast<const uint8_t*>(decoded.data());
    }
    for (int64_t j = 0; j < c_.lin_v_heads; ++j)
      std::memcpy(out.data() + r * row_bytes + j * head_bytes, row + stored_v_head(j) * head_bytes, size_t(head_bytes));
  }
  Matrix result = m;
  result.data = out.data();
  if (!whole_blocks) {
    result.format = MatrixFormat::Dense;
    result.dtype = DType::F32;
  }
  return result;
}

// attn_q keeps q_proj's per-head [query (D) | gate (D)] rows, which the converter does not split.
void GgufWeightMapper::map_attention(const std::string& p, const std::string& layer, LayerWeights& L) {
  const int64_t H = c_.hidden, D = c_.head_dim, Hq = c_.n_heads, Hkv = c_.n_kv_heads;
  AttentionWeights& A = L.attn;
  if (c_.attn_output_gate) {
    const Matrix qg = matrix(p + "attn_q.weight", {H, 2 * Hq * D}, layer + " attention q_proj (query+gate per head)");
    std::vector<int32_t> q_rows, g_rows;
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t d = 0; d < D; ++d) {
        q_rows.push_back(int32_t(h * 2 * D + d));
        g_rows.push_back(int32_t(h * 2 * D + D + d));
      }
    A.q = gather(qg, std::move(q_rows));
    A.gate = gather(qg, std::move(g_rows));
  } else {
    A.q = matrix(p + "attn_q.weight", {H, Hq * D}, layer + " attention q_proj");
  }
  A.k = matrix(p + "attn_k.weight", {H, Hkv * D}, layer + " attention k_proj");
  A.v = matrix(p + "attn_v.weight", {H, Hkv * D}, layer + " attention v_proj");
  A.o = matrix(p + "attn_output.weight", {Hq * D, H}, layer + " attention o_proj");
  // Qwen3NextModel.modify_tensors adds 1 to every norm but linear_attn.norm: the stored q/k norms
  // are the multipliers Petrel keeps (for qwen3 they were plain multipliers to begin with).
  A.q_norm = vector(p + "attn_q_norm.weight", D, layer + " attention q_norm");
  A.k_norm = vector(p + "attn_k_norm.weight", D, layer + " attention k_norm");
}

void GgufWeightMapper::map_deltanet(const std::string& p, const std::string& layer, LayerWeights& L) {
  const int64_t H = c_.hidden, Hk = c_.lin_k_heads, Hv = c_.lin_v_heads, dk = c_.lin_k_dim, dv = c_.lin_v_dim;
  const int64_t r = Hv / Hk, C = c_.gdn_conv_channels(), K = c_.conv_kernel;
  const std::string role = layer + " gated deltanet";
  DeltaNetWeights& G = L.gdn;
  if (find(p + "ssm_in.weight")) {
    // GGUFs from before llama.cpp PR #18683 keep Qwen3-Next's in_proj_qkvz as it is, grouped per key
    // head g as [q_g | k_g | v_{g·r..} | z_{g·r..}]; gather it as the Hugging Face loader does.
    const int64_t P = 2 * dk + 2 * r * dv;
    const Matrix qkvz = matrix(p + "ssm_in.weight", {H, Hk * P}, role + " in_proj_qkvz");
    std::vector<int32_t> qkv_rows, z_rows;
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t g = 0; g < Hk; ++g)
        for (int64_t d = 0; d < dk; ++d) qkv_rows.push_back(int32_t(g * P + part * dk + d));
    for (int64_t j = 0; j < Hv; ++j)
      for (int64_t d = 0; d < dv; ++d) {
        qkv_rows.push_back(int32_t((j / r) * P + 2 * dk + (j % r) * dv + d));
        z_rows.push_back(int32_t((j / r) * P + 2 * dk + r * dv + (j % r) * dv + d));
      }
    G.qkv = gather(qkvz, std::move(qkv_rows));
    G.z = gather(qkvz, std::move(z_rows));
  } else {
    // Qwen3NextModel.modify_tensors de-interleaves in_proj_qkvz into attn_qkv = [q | k | v] and
    // attn_gate = z; Qwen3.5's separate in_proj_qkv and in_proj_z only had their V heads moved.
    G.qkv = v_head_rows(matrix(p + "attn_qkv.weight", {H, C}, role + " in_proj_qkv"), 2 * Hk * dk, dv);
    G.z = v_head_rows(matrix(p + "attn_gate.weight", {H, Hv * dv}, role + " in_proj_z"), 0, dv);
  }
  if (c_.arch == Arch::Qwen3Next) {
    // in_proj_ba is stored raw (ssm_ba), grouped per key head as [b_{g·r..} | a_{g·r..}].
    const Matrix ba = matrix(p + "ssm_ba.weight", {H, 2 * Hv}, role + " in_proj_ba");
    std::vector<int32_t> b_rows, a_rows;
    for (int64_t j = 0; j < Hv; ++j) {
      b_rows.push_back(int32_t((j / r) * 2 * r + j % r));
      a_rows.push_back(int32_t((j / r) * 2 * r + r + j % r));
    }
    G.b = gather(ba, std::move(b_rows));
    G.a = gather(ba, std::move(a_rows));
  } else {
    G.b = v_head_rows(matrix(p + "ssm_beta.weight", {H, Hv}, role + " in_proj_b"), 0, 1);
    G.a = v_head_rows(matrix(p + "ssm_alpha.weight", {H, Hv}, role + " in_proj_a"), 0, 1);
  }
  G.out = v_head_columns(matrix(p + "ssm_out.weight", {Hv * dv, H}, role + " out_proj"), dv);

  // conv1d [C, 1, K] was squeezed to [C, K], i.e. {K, C}: the same c-major, k-minor floats.
  const std::vector<float> conv = values(p + "ssm_conv1d.weight", {K, C}, role + " conv1d");
  G.conv.resize(size_t(C * K));
  for (int64_t c = 0; c < C; ++c) {
    const int64_t v = c - 2 * Hk * dk;  // a V channel: head v / dv moved
    const int64_t from = v < 0 ? c : 2 * Hk * dk + stored_v_head(v / dv) * dv + v % dv;
    std::copy_n(conv.begin() + from * K, K, G.conv.begin() + c * K);
  }
  // Qwen3NextModel.modify_tensors stores A_log as ssm_a = -exp(A_log) and renames dt_bias to
  // dt_proj.bias (ssm_dt.bias); the norm is linear_attn.norm, the one norm left without +1.
  const std::vector<float> a = vector(p + "ssm_a", Hv, role + " A_log (stored as -exp(A_log))");
  const std::vector<float> dt = vector(p + "ssm_dt.bias", Hv, role + " dt_bias");
  G.A_log.resize(size_t(Hv));
  G.dt_bias.resize(size_t(Hv));
  for (int64_t j = 0; j < Hv; ++j) {
    const float stored = a[size_t(stored_v_head(j))];
    check(stored < 0, model_.path() + ": tensor '" + p + "ssm_a' holds " + std::to_string(stored) +
                          " for value head " + std::to_string(j) + ", expected -exp(A_log) < 0");
    G.A_log[j] = std::log(-stored);
    G.dt_bias[j] = dt[size_t(stored_v_head(j))];
  }
  G.norm = vector(p + "ssm_norm.weight", dv, role + " gated norm");
}

MlpWeights GgufWeightMapper::mlp(const std::string& p, const std::string& suffix, int64_t I, const std::string& role) {
  const int64_t H = c_.hidden;
  MlpWeights m;
  m.gate = matrix(p + "ffn_gate" + suffix + ".weight", {H, I}, role + " gate_proj");
  m.up = matrix(p + "ffn_up" + suffix + ".weight", {H, I}, role + " up_proj");
  m.down = matrix(p + "ffn_down" + suffix + ".weight", {I, H}, role + " down_proj");
  return m;
}

void GgufWeightMapper::map_ffn(bool moe, const std::string& p, const std::string& layer, FfnWeights& F) {
  const int64_t H = c_.hidden;
  F.moe = moe;
  if (!F.moe) {
    F.dense = mlp(p, "", c_.intermediate, layer + " mlp");
    return;
  }
  const int64_t E = c_.n_experts, I = c_.moe_intermediate;
  F.router = matrix(p + "ffn_gate_inp.weight", {H, E}, layer + " mlp router (mlp.gate)");
  F.experts.resize(size_t(E));
  if (find(p + "ffn_gate_up_exps.weight")) {
    // TextModel.modify_tensors with fuse_gate_up_exps concatenates each expert's gate and up rows.
    const Matrix gu = matrix(p + "ffn_gate_up_exps.weight", {H, 2 * I, E}, layer + " experts gate_up_proj");
    for (int64_t e = 0; e < E; ++e) {
      F.experts[e].gate = gu.slice_rows(e * 2 * I, I);
      F.experts[e].up = gu.slice_rows(e * 2 * I + I, I);
    }
  } else {
    const Matrix gate = matrix(p + "ffn_gate_exps.weight", {H, I, E}, layer + " experts gate_proj");
    const Matrix up = matrix(p + "ffn_up_exps.weight", {H, I, E}, layer + " experts up_proj");
    for (int64_t e = 0; e < E; ++e) {
      F.experts[e].gate = gate.slice_rows(e * I, I);
      F.experts[e].up = up.slice_rows(e * I, I);
    }
  }
  const Matrix down = matrix(p + "ffn_down_exps.weight", {I, H, E}, layer + " experts down_proj");
  for (int64_t e = 0; e < E; ++e) F.experts[e].down = down.slice_rows(e * H, H);
  F.has_shared = c_.shared_intermediate > 0;
  if (!F.has_shared) return;
  F.shared = mlp(p, "_shexp", c_.shared_intermediate, layer + " shared expert");
  // shared_expert_gate [1, H] is {H, 1}; some converters squeeze it to {H}.
  const GgufTensor* g = find(p + "ffn_gate_inp_shexp.weight");
  const bool squeezed = g && g->ne.size() == 1;
  F.shared_gate = matrix(p + "ffn_gate_inp_shexp.weight", squeezed ? std::vector<int64_t>{H} : std::vector<int64_t>{H, 1},
                         layer + " shared_expert_gate");
}

void GgufWeightMapper::map_layer(const std::string& p, const std::string& layer, LayerKind kind, bool moe,
                                 LayerWeights& L) {
  const int64_t H = c_.hidden;
  L.kind = kind;
  // The hybrids' norms had 1 added by Qwen3NextModel.modify_tensors: the multipliers Petrel keeps.
  L.input_norm = vector(p + "attn_norm.weight", H, layer + " input_layernorm");
  L.post_norm = vector(p + (c_.hybrid() ? "post_attention_norm.weight" : "ffn_norm.weight"), H,
                       layer + " post_attention_layernorm");
  if (L.kind == LayerKind::DeltaNet) map_deltanet(p, layer, L);
  else map_attention(p, layer, L);
  map_ffn(moe, p, layer, L.ffn);
}

// _Qwen35MtpMixin.filter_tensors renames mtp.layers.j.* to layers.{n_layers + j}.*, an ordinary
// full-attention block, and mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm} to
// layers.{n_layers}.{eh_proj, enorm, hnorm, shared_head.norm}, which tensor_mapping.py names
// blk.{n_layers}.nextn.*; their norms had 1 added like the trunk's.
void GgufWeightMapper::map_mtp() {
  const int64_t H = c_.hidden;
  const std::string p = "blk." + std::to_string(c_.n_layers) + ".";
  MtpWeights& M = ck_.weights_.mtp;
  M.fc = matrix(p + "nextn.eh_proj.weight", {2 * H, H}, "mtp fc (nextn.eh_proj)");
  M.embed_norm = vector(p + "nextn.enorm.weight", H, "mtp pre_fc_norm_embedding (nextn.enorm)");
  M.hidden_norm = vector(p + "nextn.hnorm.weight", H, "mtp pre_fc_norm_hidden (nextn.hnorm)");
  M.norm = vector(p + "nextn.shared_head_norm.weight", H, "mtp norm (nextn.shared_head_norm)");
  M.layers.resize(size_t(c_.mtp_layers));
  for (int j = 0; j < c_.mtp_layers; ++j)
    map_layer("blk." + std::to_string(c_.n_layers + j) + ".", "mtp layer " + std::to_string(j),
              LayerKind::FullAttention, c_.n_experts > 0, M.layers[size_t(j)]);
}

void GgufWeightMapper::run() {
  ModelWeights& W = ck_.weights_;
  const int64_t H = c_.hidden, V = c_.vocab;
  W.embed = matrix("token_embd.weight", {H, V}, "token embedding");
  W.layers.resize(c_.n_layers);
  for (int i = 0; i < c_.n_layers; ++i)
    map_layer("blk." + std::to_string(i) + ".", "layer " + std::to_string(i), c_.layer_kinds[i], c_.layer_is_moe[i],
              W.layers[i]);
  W.final_norm = vector("output_norm.weight", H, "final norm");
  if (c_.mtp_layers > 0) map_mtp();
  W.lm_head = c_.tie_embeddings ? W.embed : matrix("output.weight", {H, V}, "lm_head");
  for (const auto& [name, t] : model_.tensors())
    if (!used_.count(name)) ck_.info_.skipped.push_back(name);

  // "gguf Q4_K/Q6_K": the matrices' types, the one holding the most bytes first.
  std::vector<std::pair<size_t, GgmlType>> by_bytes;
  for (const auto& [type, bytes] : matrix_bytes_) by_bytes.emplace_back(bytes, type);
  std::sort(by_bytes.rbegin(), by_bytes.rend());
  std::string name = "gguf ";
  for (size_t i = 0; i < by_bytes.size(); ++i) {
    if (i) name += '/';
    name += ggml_type_name(by_bytes[i].second);
  }
  ck_.info_.format_name = name;
}

void Checkpoint::open_gguf() {
  gguf_ = std::make_unique<GgufModel>(dir_);
  info_.format = CheckpointFormat::Gguf;
  config_ = parse_gguf_config(*gguf_);
  GgufWeightMapper(*this).run();
}

}  // namespace petrel
