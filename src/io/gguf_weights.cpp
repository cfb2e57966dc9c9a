// A GGUF checkpoint's tensors -> canonical roles, undoing what llama.cpp's converter
// (convert_hf_to_gguf.py and its conversion/ modules) did to the Hugging Face tensors. For qwen3
// and qwen3moe that is renames and expert stacking only:
//
// - Names: TextModel.modify_tensors maps each HF name through gguf-py's tensor_mapping.py to the
//   arch's names in constants.py (MODEL_TENSORS[QWEN3], [QWEN3MOE]): model.embed_tokens ->
//   token_embd, lm_head -> output, model.norm -> output_norm, layers.N -> blk.N, input_layernorm
//   -> attn_norm, post_attention_layernorm -> ffn_norm, self_attn.{q,k,v,o}_proj ->
//   attn_{q,k,v,output}, self_attn.{q,k}_norm -> attn_{q,k}_norm, mlp.{gate,up,down}_proj ->
//   ffn_{gate,up,down}, mlp.gate -> ffn_gate_inp.
// - Dims: GGUF lists them in ggml order, the reverse of PyTorch's, so a PyTorch [out, in] weight
//   is {in, out} with rows of `in` elements: the same bytes as Petrel's [rows, cols] Matrix.
// - Experts: Qwen2MoeModel.modify_tensors stacks the per-expert tensors of a layer with
//   torch.stack(dim=0) into ffn_{gate,up}_exps {H, I, E} and ffn_down_exps {I, H, E}; expert e is
//   the e-th run of I (or H) rows.
// - Qwen3's RMSNorm weights are plain multipliers (not zero-centred), so no +1 is involved, and
//   Qwen RoPE is NeoX-style, so the converter does not permute q/k rows (LlamaModel's permute).
#include <algorithm>
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
  std::vector<float> vector(const std::string& name, int64_t n, const std::string& role);
  void map_layer(int i, LayerWeights& L);

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

std::vector<float> GgufWeightMapper::vector(const std::string& name, int64_t n, const std::string& role) {
  const GgufTensor& t = tensor(name, role);
  check(t.ne == std::vector<int64_t>{n}, t.file + ": tensor '" + name + "' (" + role + ") has shape " + t.shape_str() +
                                             ", expected {" + std::to_string(n) + "}");
  check_decoded(t, role);
  std::vector<float> v(static_cast<size_t>(n));
  ggml_dequantize_row(t.type, t.data, n, v.data());
  return v;
}

void GgufWeightMapper::map_layer(int i, LayerWeights& L) {
  const std::string p = "blk." + std::to_string(i) + ".";
  const std::string layer = "layer " + std::to_string(i);
  const int64_t H = c_.hidden, D = c_.head_dim, Hq = c_.n_heads, Hkv = c_.n_kv_heads;
  L.kind = LayerKind::FullAttention;
  L.input_norm = vector(p + "attn_norm.weight", H, layer + " input_layernorm");
  L.post_norm = vector(p + "ffn_norm.weight", H, layer + " post_attention_layernorm");
  AttentionWeights& A = L.attn;
  A.q = matrix(p + "attn_q.weight", {H, Hq * D}, layer + " attention q_proj");
  A.k = matrix(p + "attn_k.weight", {H, Hkv * D}, layer + " attention k_proj");
  A.v = matrix(p + "attn_v.weight", {H, Hkv * D}, layer + " attention v_proj");
  A.o = matrix(p + "attn_output.weight", {Hq * D, H}, layer + " attention o_proj");
  A.q_norm = vector(p + "attn_q_norm.weight", D, layer + " attention q_norm");
  A.k_norm = vector(p + "attn_k_norm.weight", D, layer + " attention k_norm");

  FfnWeights& F = L.ffn;
  F.moe = c_.layer_is_moe[i];
  if (!F.moe) {
    const int64_t I = c_.intermediate;
    F.dense.gate = matrix(p + "ffn_gate.weight", {H, I}, layer + " mlp gate_proj");
    F.dense.up = matrix(p + "ffn_up.weight", {H, I}, layer + " mlp up_proj");
    F.dense.down = matrix(p + "ffn_down.weight", {I, H}, layer + " mlp down_proj");
    return;
  }
  const int64_t E = c_.n_experts, I = c_.moe_intermediate;
  F.router = matrix(p + "ffn_gate_inp.weight", {H, E}, layer + " mlp router (mlp.gate)");
  const Matrix gate = matrix(p + "ffn_gate_exps.weight", {H, I, E}, layer + " experts gate_proj");
  const Matrix up = matrix(p + "ffn_up_exps.weight", {H, I, E}, layer + " experts up_proj");
  const Matrix down = matrix(p + "ffn_down_exps.weight", {I, H, E}, layer + " experts down_proj");
  F.experts.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    F.experts[e].gate = gate.slice_rows(e * I, I);
    F.experts[e].up = up.slice_rows(e * I, I);
    F.experts[e].down = down.slice_rows(e * H, H);
  }
}

void GgufWeightMapper::run() {
  ModelWeights& W = ck_.weights_;
  const int64_t H = c_.hidden, V = c_.vocab;
  W.embed = matrix("token_embd.weight", {H, V}, "token embedding");
  W.layers.resize(c_.n_layers);
  for (int i = 0; i < c_.n_layers; ++i) map_layer(i, W.layers[i]);
  W.final_norm = vector("output_norm.weight", H, "final norm");
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
