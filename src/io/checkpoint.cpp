#include "io/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>

#include "core/error.h"
#include "core/fp8.h"
#include "io/hf_config.h"
#include "io/json_file.h"
#include "io/model_folder.h"

namespace fs = std::filesystem;

namespace petrel {
namespace {

using json = nlohmann::json;

// Prefixes that wrap the language model in released files, rewritten to the plain "model." form.
const std::pair<const char*, const char*> kPrefixRewrites[] = {
    {"model.language_model.", "model."},           // HF Qwen3.5 VLM
    {"language_model.model.", "model."},           // mlx-lm / mlx-vlm Qwen3.5
    {"language_model.lm_head.", "lm_head."},
    {"model.mtp.", "mtp."},                        // the multi-token prediction head
    {"language_model.mtp.", "mtp."},
};
// Tensors a text-only model never reads.
const char* kSkippedPrefixes[] = {"model.visual.", "visual.", "vision_tower.", "model.vision_tower."};

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string canonical_name(const std::string& name) {
  for (const auto& [from, to] : kPrefixRewrites)
    if (starts_with(name, from)) return std::string(to) + name.substr(std::strlen(from));
  return name;
}

std::string shape_str(const std::vector<int64_t>& s) {
  TensorInfo t;
  t.shape = s;
  return t.shape_str();
}

std::shared_ptr<const std::vector<int32_t>> make_map(std::vector<int32_t> v) {
  return std::make_shared<const std::vector<int32_t>>(std::move(v));
}

// Field `key` ("bits" or "group_size") of an MLX quantization object, or `fallback` when absent.
int quant_field(const json& q, const char* key, int fallback, const std::string& where) {
  if (!q.contains(key)) return fallback;
  const json& v = q[key];
  check(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 1 << 16,
        where + ": field '" + key + "' must be an integer in [1, 65536], found " + v.dump());
  return v.get<int>();
}

// A shard name from the index: a file in the checkpoint folder itself, as every writer makes them.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

// Maps checkpoint tensors to canonical roles, checking every shape against the config.
class WeightMapper {
 public:
  explicit WeightMapper(Checkpoint& ck) : ck_(ck), c_(ck.config_) {}

  void run();

 private:
  const TensorInfo& tensor(const std::string& name, const std::string& role) const;
  const TensorInfo* find(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }
  void expect_shape(const TensorInfo& t, const std::vector<int64_t>& shape, const std::string& role) const;
  void quant_params(const std::string& module, int* bits, int* group) const;
  // The block scales of fp8 codes `w`, checked against their `grid` shape.
  const TensorInfo& fp8_scales(const TensorInfo& w, const std::string& module, const std::vector<int64_t>& grid,
                               const std::string& role);
  // Fills `m` from fp8 codes `w` and their block scales, the codes' shape already checked.
  void fp8_matrix(Matrix& m, const TensorInfo& w, const std::string& module, std::vector<int64_t> lead,
                  int64_t rows, int64_t cols, const std::string& role);
  // The GPTQ or AWQ tensor set of `module` as an affine matrix, repacked while the weights are paged in.
  Matrix packed_matrix(const std::string& module, const std::vector<int64_t>& lead, int64_t rows, int64_t cols,
                       const std::string& role);
  // A [rows, cols] matrix, or a stack [lead..., rows, cols] viewed as one tall matrix.
  Matrix matrix(const std::string& module, std::vector<int64_t> lead, int64_t rows, int64_t cols,
                const std::string& role);
  std::vector<float> vector(const std::string& name, int64_t n, const std::string& role);
  std::vector<float> norm(const std::string& name, int64_t n, const std::string& role);

  // A decoder layer under `p` ("model.layers.3."), `role` naming it in messages.
  void map_layer(const std::string& p, const std::string& role, LayerKind kind, bool moe, LayerWeights& L);
  void map_attention(const std::string& p, const std::string& role, LayerWeights& L);
  void map_deltanet(const std::string& p, const std::string& role, LayerWeights& L);
  void map_ffn(const std::string& p, const std::string& role, bool moe, LayerWeights& L);
  void map_mtp();
  MlpWeights mlp(const std::string& prefix, int64_t inter, const std::string& role);
  std::vector<MlpWeights> experts(const std::string& prefix, const std::string& role);

  Checkpoint& ck_;
  const ModelConfig& c_;
  bool shifted_ = false;   // MLX files fold the zero-centred +1 into norm weights
  std::set<std::string> used_;
};

const TensorInfo* WeightMapper::find(const std::string& name) const {
  auto it = ck_.tensors_.find(name);
  return it == ck_.tensors_.end() ? nullptr : it->second;
}

const TensorInfo& WeightMapper::tensor(const std::string& name, const std::string& role) const {
  const TensorInfo* t = find(name);
  check(t != nullptr, "checkpoint " + ck_.dir_ + ": missing tensor '" + name + "' (" + role + ")");
  const_cast<WeightMapper*>(this)->used_.insert(name);
  return *t;
}

void WeightMapper::expect_shape(const TensorInfo& t, const std::vector<int64_t>& shape,
                                const std::string& role) const {
  check(t.shape == shape, t.file + ": tensor '" + t.name +
                              "' (" + role + ") has shape " + t.shape_str() + ", expected " + shape_str(shape));
}

void WeightMapper::quant_params(const std::string& module, int* bits, int* group) const {
  const json& q = ck_.quant_.mlx;
  const std::string where = (fs::path(ck_.dir_) / "config.json").string() + ": quantization";
  *bits = quant_field(q, "bits", 4, where);
  *group = quant_field(q, "group_size", 64, where);
  const std::string orig = ck_.original_name_.count(module + ".weight")
                               ? ck_.original_name_.at(module + ".weight")
                               : module + ".weight";
  const std::string orig_module = orig.substr(0, orig.size() - std::strlen(".weight"));
  for (const std::string& key : {orig_module, module}) {
    if (q.contains(key) && q[key].is_object()) {
      *bits = quant_field(q[key], "bits", *bits, where + "." + key);
      *group = quant_field(q[key], "group_size", *group, where + "." + key);
      return;
    }
  }
}

Matrix WeightMapper::matrix(const std::string& module, std::vector<int64_t> lead, int64_t rows, int64_t cols,
                            const std::string& role) {
  int64_t stack = 1;
  for (int64_t d : lead) stack *= d;
  Matrix m;
  m.name = module;
  m.rows = stack * rows;
  m.cols = cols;
  auto dims = [&](int64_t last) {
    std::vector<int64_t> s = lead;
    s.push_back(rows);
    s.push_back(last);
    return s;
  };
  const QuantMethod method = ck_.quant_.method;
  if ((method == QuantMethod::Gptq || method == QuantMethod::Awq) &&
      (has(module + ".qweight") || has(module + ".qzeros") || has(module + ".scales")))
    return packed_matrix(module, lead, rows, cols, role);
  if (!has(module + ".scales")) {
    const TensorInfo& w = tensor(module + ".weight", role);
    if (w.dtype == DType::F8_E4M3) {
      expect_shape(w, dims(cols), role);
      fp8_matrix(m, w, module, lead, rows, cols, role);
      return m;
    }
    check(is_float_dtype(w.dtype), w.file + ": tensor '" + w.name + "' (" + role +
                                       ") has dtype " + dtype_name(w.dtype) + ", expected F32, F16 or BF16");
    expect_shape(w, dims(cols), role);
    m.format = MatrixFormat::Dense;
    m.dtype = w.dtype;
    m.data = w.data;
    return m;
  }
  int bits = 0, group = 0;
  quant_params(module, &bits, &group);
  const TensorInfo& w = tensor(module + ".weight", role);
  const TensorInfo& s = tensor(module + ".scales", role + " scales");
  const TensorInfo& b = tensor(module + ".biases", role + " biases");
  check(bits == 4 || bits == 8, w.file + ": tensor '" + w.name + "': " +
                                    std::to_string(bits) + "-bit quantization is not supported (expected 4 or 8)");
  check(cols % group == 0, w.file + ": tensor '" + w.name + "': input dim " +
                               std::to_string(cols) + " is not a multiple of group_size " + std::to_string(group));
  check(cols * bits % 32 == 0, w.file + ": tensor '" + w.name + "': input dim " + std::to_string(cols) + " of " +
                                   std::to_string(bits) + "-bit codes does not fill whole 32-bit words");
  check(w.dtype == DType::U32, w.file + ": tensor '" + w.name +
                                   "' is quantized (has .scales) but its dtype is " + dtype_name(w.dtype) +
                                   ", expected U32");
  expect_shape(w, dims(cols * bits / 32), role + " (" + std::to_string(bits) + "-bit packed, group " +
                                              std::to_string(group) + ")");
  expect_shape(s, dims(cols / group), role + " scales");
  expect_shape(b, dims(cols / group), role + " biases");
  check(is_float_dtype(s.dtype) && s.dtype == b.dtype,
        s.file + ": scales/biases of '" + module + "' must share one float dtype");
  m.format = MatrixFormat::Affine;
  m.dtype = s.dtype;
  m.data = w.data;
  m.scales = s.data;
  m.biases = b.data;
  m.bits = bits;
  m.group = group;
  return m;
}

// AWQ's gemm packing puts row offset j (0..7) of a word's eight rows in nibble kAwqNibble[j]
// (nibbles hold rows 0 2 4 6 1 3 5 7).
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

Matrix WeightMapper::packed_matrix(const std::string& module, const std::vector<int64_t>& lead, int64_t rows,
                                   int64_t cols, const std::string& role) {
  const QuantConfig& q = ck_.quant_;
  const bool gptq = q.method == QuantMethod::Gptq;
  const std::string method = gptq ? "GPTQ" : "AWQ";
  const TensorInfo& qw = tensor(module + ".qweight", role);
  const std::string what = qw.file + ": tensor '" + qw.name + "' (" + role + ")";
  check(lead.empty(), what + " is a stack of " + method + " codes; expected one tensor set per expert");
  const int bits = q.bits, per = 32 / bits;
  const int64_t group = q.group_size == -1 ? cols : q.group_size;
  check(cols % group == 0, what + ": input dim " + std::to_string(cols) + " is not a multiple of group_size " +
                               std::to_string(group));
  check(cols % per == 0 && rows % per == 0, what + ": shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                                "] of " + std::to_string(bits) +
                                                "-bit codes does not fill whole 32-bit words");
  const TensorInfo& qz = tensor(module + ".qzeros", role + " zero points");
  const TensorInfo& sc = tensor(module + ".scales", role + " scales");
  for (const TensorInfo* t : {&qw, &qz})
    check(t->dtype == DType::I32 || t->dtype == DType::U32, t->file + ": tensor '" + t->name + "' (" + role +
                                                                ") has dtype " + dtype_name(t->dtype) + ", expected I32");
  check(is_float_dtype(sc.dtype), sc.file + ": tensor '" + sc.name + "' (" + role + " scales) has dtype " +
                                      dtype_name(sc.dtype) + ", expected F16, BF16 or F32");
  const int64_t groups = cols / group, words = cols / per;
  const std::string layout = " (" + method + " " + std::to_string(bits) + "-bit, group " + std::to_string(group) + ")";
  expect_shape(qw, gptq ? std::vector<int64_t>{words, rows} : std::vector<int64_t>{cols, rows / per}, role + layout);
  expect_shape(qz, {groups, rows / per}, role + " zero points" + layout);
  expect_shape(sc, {groups, rows}, role + " scales" + layout);
  if (gptq && has(module + ".g_idx")) {
    // Act-order (desc_act) files scatter a group over the input features; affine groups are runs.
    const TensorInfo& gi = tensor(module + ".g_idx", role + " g_idx");
    const std::string gw = gi.file + ": tensor '" + gi.name + "' (" + role + " g_idx)";
    check(gi.dtype == DType::I32, gw + " has dtype " + dtype_name(gi.dtype) + ", expected I32");
    expect_shape(gi, {cols}, role + " g_idx");
    for (int64_t i = 0; i < cols; ++i) {
      int32_t g = 0;
      std::memcpy(&g, gi.data + 4 * i, 4);
      check(g == i / group, gw + ": input feature " + std::to_string(i) + " is in group " + std::to_string(g) +
                                ", expected " + std::to_string(i / group) + " (feature / group_size " +
                                std::to_string(group) + "): act-order (desc_act) groups that are not runs of "
                                "consecutive features cannot be read");
    }
  }
  auto own = [&](int64_t n) { return ck_.owned_.emplace_back(new uint8_t[size_t(n) * 4]).get(); };
  uint32_t* codes = reinterpret_cast<uint32_t*>(own(rows * words));
  float* scales = reinterpret_cast<float*>(own(rows * groups));
  float* biases = reinterpret_cast<float*>(own(rows * groups));
  const uint8_t *qwp = qw.data, *qzp = qz.data, *scp = sc.data;
  const DType sdt = sc.dtype;
  const uint32_t zero_offset = gptq && q.zeros_minus_one ? 1 : 0;
  auto run = [=] {
    auto word = [](const uint8_t* p, int64_t i) {
      uint32_t w;
      std::memcpy(&w, p + 4 * i, 4);
      return w;
    };
    const uint32_t mask = (1u << bits) - 1u;
    // Both layouts are transposed from petrel's: written 64 rows at a time, so those stay in cache.
    constexpr int64_t kTile = 64;
    if (gptq) {
      // GPTQ word [j, r] packs features j·per.. of row r as petrel's word [r, j] does.
      for (int64_t r0 = 0; r0 < rows; r0 += kTile)
        for (int64_t j = 0; j < words; ++j)
          for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r) codes[r * words + j] = word(qwp, j * rows + r);
    } else {
      std::fill(codes, codes + rows * words, 0u);
      for (int64_t w0 = 0; w0 < rows / 8; w0 += kTile / 8)
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t w = w0; w < std::min(rows / 8, w0 + kTile / 8); ++w) {
            const uint32_t v = word(qwp, c * (rows / 8) + w);
            for (int j = 0; j < 8; ++j)
              codes[(w * 8 + j) * words + c / 8] |= ((v >> 4 * kAwqNibble[j]) & 15u) << 4 * (c % 8);
          }
    }
    // w = s·(q - z) = s·q + bias with bias = -z·s, exact in f32 for an f16/bf16 s and a small integer z.
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < rows; ++r) {
        const int slot = gptq ? int(r % per) : kAwqNibble[r % 8];
        const uint32_t z = ((word(qzp, g * (rows / per) + r / per) >> bits * slot) & mask) + zero_offset;
        const float s = load_as_f32(scp, sdt, size_t(g * rows + r));
        scales[r * groups + g] = s;
        biases[r * groups + g] = -float(z) * s;
      }
  };
  ck_.repacks_.push_back({{{qw.data, qw.nbytes}, {qz.data, qz.nbytes}, {sc.data, sc.nbytes}}, run});
  Matrix m;
  m.name = module;
  m.rows = rows;
  m.cols = cols;
  m.format = MatrixFormat::Affine;
  m.dtype = DType::F32;
  m.data = codes;
  m.scales = scales;
  m.biases = biases;
  m.bits = bits;
  m.group = int(group);
  return m;
}

// transformers names a Linear's scales "<module>.weight_scale_inv"; a fused expert stack, which has
// no ".weight" suffix, "<stack>_scale_inv" (older versions "<stack>_scales_inv").
const TensorInfo& WeightMapper::fp8_scales(const TensorInfo& w, const std::string& module,
                                           const std::vector<int64_t>& grid, const std::string& role) {
  const bool plain = ends_with(w.name, ".weight");
  std::string name = plain ? module + ".weight_scale_inv" : module + "_scale_inv";
  if (!plain && !has(name) && has(module + "_scales_inv")) name = module + "_scales_inv";
  check(has(name), w.file + ": tensor '" + w.name + "' (" + role + ") holds F8_E4M3 codes, but its block scales '" +
                       w.name + "_scale_inv' are missing");
  const TensorInfo& s = tensor(name, role + " block scales");
  const std::string what = s.file + ": tensor '" + s.name + "' (" + role + " block scales)";
  check(is_float_dtype(s.dtype), what + " has dtype " + dtype_name(s.dtype) + ", expected F32, BF16 or F16");
  const QuantConfig& q = ck_.quant_;
  check(s.shape == grid, what + " has shape " + s.shape_str() + ", expected " + shape_str(grid) + ": one scale per " +
                             std::to_string(q.block_rows) + "x" + std::to_string(q.block_cols) +
                             " block (weight_block_size) of the " + shape_str(w.shape) + " weight");
  for (int64_t i = 0; i < s.numel(); ++i) {
    const float v = load_as_f32(s.data, s.dtype, size_t(i));
    check(std::isfinite(v), what + ": scale " + std::to_string(i) + " is " + std::to_string(v) +
                                ", expected a finite number");
  }
  return s;
}

void WeightMapper::fp8_matrix(Matrix& m, const TensorInfo& w, const std::string& module, std::vector<int64_t> lead,
                              int64_t rows, int64_t cols, const std::string& role) {
  const QuantConfig& q = ck_.quant_;
  const std::string what = w.file + ": tensor '" + w.name + "' (" + role + ")";
  check(q.method == QuantMethod::Fp8, what + " holds F8_E4M3 codes, but " +
                                          (fs::path(ck_.dir_) / "config.json").string() +
                                          " has no quantization_config with quant_method \"fp8\" giving their "
                                          "weight_block_size");
  m.fp8 = Fp8Blocks{q.block_rows, q.block_cols, rows, 0};
  std::vector<int64_t> grid = std::move(lead);
  grid.push_back(m.fp8.grid_rows());
  grid.push_back(m.fp8.grid_cols(cols));
  const TensorInfo& s = fp8_scales(w, module, grid, role);
  // A NaN code would turn every output it touches into NaN; refuse the file instead.
  const size_t nan_at = find_e4m3_nan(w.data, w.nbytes);
  check(nan_at == w.nbytes, what + ": weight " + std::to_string(nan_at) + " (row " +
                                std::to_string(int64_t(nan_at) / cols) + ", column " +
                                std::to_string(int64_t(nan_at) % cols) + ") is an e4m3 NaN code; the file is damaged");
  m.format = MatrixFormat::Fp8;
  m.dtype = s.dtype;
  m.data = w.data;
  m.scales = s.data;
}

std::vector<float> WeightMapper::vector(const std::string& name, int64_t n, const std::string& role) {
  const TensorInfo& t = tensor(name, role);
  check(is_float_dtype(t.dtype), t.file + ": tensor '" + ck_.original_name_.at(name) + "' (" + role +
                                     ") has dtype " + dtype_name(t.dtype) + ", expected a float type");
  check(t.numel() == n, t.file + ": tensor '" + t.name + "' (" + role + ") has shape " +
                            t.shape_str() + ", expected " + std::to_string(n) + " elements");
  std::vector<float> v(n);
  convert_to_f32(t.data, t.dtype, n, v.data());
  return v;
}

// Zero-centred norms (Qwen3-Next / Qwen3.5) store w with output n·(1+w); MLX files store 1+w already.
std::vector<float> WeightMapper::norm(const std::string& name, int64_t n, const std::string& role) {
  std::vector<float> v = vector(name, n, role);
  const bool zero_centred = c_.arch == Arch::Qwen3_5Moe || c_.arch == Arch::Qwen3_5 || c_.arch == Arch::Qwen3Next;
  if (zero_centred && !shifted_)
    for (float& x : v) x += 1.0f;
  return v;
}

static Matrix gather_rows(const Matrix& m, std::vector<int32_t> rows) {
  Matrix s = m;
  s.rows = int64_t(rows.size());
  s.row_map = make_map(std::move(rows));
  return s;
}

void WeightMapper::map_layer(const std::string& p, const std::string& role, LayerKind kind, bool moe,
                             LayerWeights& L) {
  L.kind = kind;
  L.input_norm = norm(p + "input_layernorm.weight", c_.hidden, role + " input_layernorm");
  L.post_norm = norm(p + "post_attention_layernorm.weight", c_.hidden, role + " post_attention_layernorm");
  if (kind == LayerKind::DeltaNet) map_deltanet(p + "linear_attn.", role + " gated deltanet", L);
  else map_attention(p + "self_attn.", role + " attention", L);
  map_ffn(p + "mlp.", role + " mlp", moe, L);
}

void WeightMapper::map_attention(const std::string& p, const std::string& role, LayerWeights& L) {
  const int64_t H = c_.hidden, D = c_.head_dim, Hq = c_.n_heads, Hkv = c_.n_kv_heads;
  AttentionWeights& A = L.attn;
  if (c_.attn_output_gate) {
    // q_proj rows are per head [query (D) | gate (D)]; split them into two plain matrices.
    Matrix qg = matrix(p + "q_proj", {}, 2 * Hq * D, H, role + " q_proj (query+gate per head)");
    std::vector<int32_t> q_rows, g_rows;
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t d = 0; d < D; ++d) {
        q_rows.push_back(int32_t(h * 2 * D + d));
        g_rows.push_back(int32_t(h * 2 * D + D + d));
      }
    A.q = gather_rows(qg, std::move(q_rows));
    A.gate = gather_rows(qg, std::move(g_rows));
  } else {
    A.q = matrix(p + "q_proj", {}, Hq * D, H, role + " q_proj");
  }
  A.k = matrix(p + "k_proj", {}, Hkv * D, H, role + " k_proj");
  A.v = matrix(p + "v_proj", {}, Hkv * D, H, role + " v_proj");
  A.o = matrix(p + "o_proj", {}, H, Hq * D, role + " o_proj");
  A.q_norm = norm(p + "q_norm.weight", D, role + " q_norm");
  A.k_norm = norm(p + "k_norm.weight", D, role + " k_norm");
}

void WeightMapper::map_deltanet(const std::string& p, const std::string& role, LayerWeights& L) {
  const int64_t H = c_.hidden, Hk = c_.lin_k_heads, Hv = c_.lin_v_heads, dk = c_.lin_k_dim, dv = c_.lin_v_dim;
  const int64_t r = Hv / Hk, C = c_.gdn_conv_channels(), K = c_.conv_kernel;
  DeltaNetWeights& G = L.gdn;
  if (has(p + "in_proj_qkvz.weight")) {
    // Qwen3-Next: rows grouped per key head g as [q_g | k_g | v_{g·r..} | z_{g·r..}].
    const int64_t P = 2 * dk + 2 * r * dv;
    Matrix qkvz = matrix(p + "in_proj_qkvz", {}, Hk * P, H, role + " in_proj_qkvz");
    std::vector<int32_t> qkv_rows, z_rows;
    for (int64_t g = 0; g < Hk; ++g)
      for (int64_t d = 0; d < dk; ++d) qkv_rows.push_back(int32_t(g * P + d));
    for (int64_t g = 0; g < Hk; ++g)
      for (int64_t d = 0; d < dk; ++d) qkv_rows.push_back(int32_t(g * P + dk + d));
    for (int64_t j = 0; j < Hv; ++j)
      for (int64_t d = 0; d < dv; ++d) {
        const int64_t g = j / r, m = j % r;
        qkv_rows.push_back(int32_t(g * P + 2 * dk + m * dv + d));
        z_rows.push_back(int32_t(g * P + 2 * dk + r * dv + m * dv + d));
      }
    G.qkv = gather_rows(qkvz, std::move(qkv_rows));
    G.z = gather_rows(qkvz, std::move(z_rows));
    Matrix ba = matrix(p + "in_proj_ba", {}, 2 * Hv, H, role + " in_proj_ba");
    std::vector<int32_t> b_rows, a_rows;
    for (int64_t j = 0; j < Hv; ++j) {
      b_rows.push_back(int32_t((j / r) * 2 * r + j % r));
      a_rows.push_back(int32_t((j / r) * 2 * r + r + j % r));
    }
    G.b = gather_rows(ba, std::move(b_rows));
    G.a = gather_rows(ba, std::move(a_rows));
  } else {
    G.qkv = matrix(p + "in_proj_qkv", {}, C, H, role + " in_proj_qkv");
    G.z = matrix(p + "in_proj_z", {}, Hv * dv, H, role + " in_proj_z");
    G.b = matrix(p + "in_proj_b", {}, Hv, H, role + " in_proj_b");
    G.a = matrix(p + "in_proj_a", {}, Hv, H, role + " in_proj_a");
  }
  G.out = matrix(p + "out_proj", {}, H, Hv * dv, role + " out_proj");
  const TensorInfo& conv = tensor(p + "conv1d.weight", role + " conv1d");
  check(conv.shape == std::vector<int64_t>{C, 1, K} || conv.shape == std::vector<int64_t>{C, K, 1},
        conv.file + ": tensor '" + conv.name + "' (" + role + " conv1d) has shape " +
            conv.shape_str() + ", expected [" + std::to_string(C) + ", 1, " + std::to_string(K) + "] (HF) or [" +
            std::to_string(C) + ", " + std::to_string(K) + ", 1] (MLX)");
  G.conv = vector(p + "conv1d.weight", C * K, role + " conv1d");  // both layouts are c-major, k-minor
  G.A_log = vector(p + "A_log", Hv, role + " A_log");
  G.dt_bias = vector(p + "dt_bias", Hv, role + " dt_bias");
  G.norm = vector(p + "norm.weight", dv, role + " gated norm");  // plain weight in every format
}

MlpWeights WeightMapper::mlp(const std::string& prefix, int64_t inter, const std::string& role) {
  MlpWeights m;
  m.gate = matrix(prefix + "gate_proj", {}, inter, c_.hidden, role + " gate_proj");
  m.up = matrix(prefix + "up_proj", {}, inter, c_.hidden, role + " up_proj");
  m.down = matrix(prefix + "down_proj", {}, c_.hidden, inter, role + " down_proj");
  return m;
}

// Experts come as a fused stack (HF Qwen3.5), an MLX switch_mlp stack, or one tensor per expert.
std::vector<MlpWeights> WeightMapper::experts(const std::string& prefix, const std::string& role) {
  const int64_t E = c_.n_experts, I = c_.moe_intermediate, H = c_.hidden;
  std::vector<MlpWeights> out(E);
  if (has(prefix + "experts.gate_up_proj")) {
    // HF stores these without a ".weight" suffix; view them through an alias.
    for (const char* part : {"gate_up_proj", "down_proj"}) {
      const std::string from = prefix + "experts." + part, to = from + ".weight";
      ck_.tensors_[to] = &tensor(from, role);
      ck_.original_name_[to] = ck_.original_name_.at(from);
    }
    Matrix gu = matrix(prefix + "experts.gate_up_proj", {E}, 2 * I, H, role + " experts.gate_up_proj");
    Matrix dn = matrix(prefix + "experts.down_proj", {E}, H, I, role + " experts.down_proj");
    for (int64_t e = 0; e < E; ++e) {
      out[e].gate = gu.slice_rows(e * 2 * I, I);
      out[e].up = gu.slice_rows(e * 2 * I + I, I);
      out[e].down = dn.slice_rows(e * H, H);
    }
    return out;
  }
  if (has(prefix + "switch_mlp.gate_proj.weight")) {
    Matrix g = matrix(prefix + "switch_mlp.gate_proj", {E}, I, H, role + " switch_mlp.gate_proj");
    Matrix u = matrix(prefix + "switch_mlp.up_proj", {E}, I, H, role + " switch_mlp.up_proj");
    Matrix d = matrix(prefix + "switch_mlp.down_proj", {E}, H, I, role + " switch_mlp.down_proj");
    for (int64_t e = 0; e < E; ++e) {
      out[e].gate = g.slice_rows(e * I, I);
      out[e].up = u.slice_rows(e * I, I);
      out[e].down = d.slice_rows(e * H, H);
    }
    return out;
  }
  for (int64_t e = 0; e < E; ++e)
    out[e] = mlp(prefix + "experts." + std::to_string(e) + ".", I, role + " expert " + std::to_string(e));
  return out;
}

void WeightMapper::map_ffn(const std::string& p, const std::string& role, bool moe, LayerWeights& L) {
  FfnWeights& F = L.ffn;
  F.moe = moe;
  if (!F.moe) {
    F.dense = mlp(p, c_.intermediate, role);
    return;
  }
  F.router = matrix(p + "gate", {}, c_.n_experts, c_.hidden, role + " router (mlp.gate)");
  F.experts = experts(p, role);
  F.has_shared = c_.shared_intermediate > 0;
  if (F.has_shared) {
    F.shared = mlp(p + "shared_expert.", c_.shared_intermediate, role + " shared expert");
    F.shared_gate = matrix(p + "shared_expert_gate", {}, 1, c_.hidden, role + " shared_expert_gate");
  }
}

// The head's decoder layers are full attention with the trunk's feed-forward kind (MoE where the
// trunk has experts).
void WeightMapper::map_mtp() {
  const int64_t H = c_.hidden;
  MtpWeights& M = ck_.weights_.mtp;
  M.fc = matrix("mtp.fc", {}, H, 2 * H, "mtp fc ([embedding | hidden] projection)");
  M.embed_norm = norm("mtp.pre_fc_norm_embedding.weight", H, "mtp pre_fc_norm_embedding");
  M.hidden_norm = norm("mtp.pre_fc_norm_hidden.weight", H, "mtp pre_fc_norm_hidden");
  M.norm = norm("mtp.norm.weight", H, "mtp norm");
  M.layers.resize(c_.mtp_layers);
  for (int j = 0; j < c_.mtp_layers; ++j)
    map_layer("mtp.layers." + std::to_string(j) + ".", "mtp layer " + std::to_string(j), LayerKind::FullAttention,
              c_.n_experts > 0, M.layers[j]);
}

void WeightMapper::run() {
  // MLX files carry conv1d as [C, K, 1] and fold the zero-centred +1 into norms; HF files are [C, 1, K].
  // The conv layout is the only reliable signal (presence of mtp.* is not; see model-spec gotcha 6).
  for (int i = 0; i < c_.n_layers; ++i) {
    if (c_.layer_kinds[i] != LayerKind::DeltaNet) continue;
    const TensorInfo* conv = find("model.layers." + std::to_string(i) + ".linear_attn.conv1d.weight");
    shifted_ = conv && conv->shape.size() == 3 && conv->shape[2] == 1 && conv->shape[1] != 1;
    break;
  }
  ModelWeights& W = ck_.weights_;
  W.embed = matrix("model.embed_tokens", {}, c_.vocab, c_.hidden, "token embedding");
  W.layers.resize(c_.n_layers);
  for (int i = 0; i < c_.n_layers; ++i)
    map_layer("model.layers." + std::to_string(i) + ".", "layer " + std::to_string(i), c_.layer_kinds[i],
              c_.layer_is_moe[i], W.layers[i]);
  W.final_norm = norm("model.norm.weight", c_.hidden, "final norm");
  if (c_.mtp_layers > 0) map_mtp();
  if (has("lm_head.weight") || !c_.tie_embeddings)
    W.lm_head = matrix("lm_head", {}, c_.vocab, c_.hidden, "lm_head");
  else
    W.lm_head = W.embed;
  ck_.info_.norms_preshifted = shifted_;
  if (!W.layers.empty() && c_.hybrid()) {
    double mean = 0;
    for (float x : W.layers[0].input_norm) mean += x;
    mean /= double(W.layers[0].input_norm.size());
    if (std::fabs(mean - 1.0) > 0.5)
      std::fprintf(stderr, "warning: %s: layer 0 input_layernorm multipliers average %.3f (expected about 1); "
                           "norm weights may be shifted twice or not at all\n", ck_.dir_.c_str(), mean);
  }
  for (const auto& [name, t] : ck_.tensors_) {
    if (ends_with(name, "experts.gate_up_proj.weight") || ends_with(name, "experts.down_proj.weight")) continue;
    if (!used_.count(name)) ck_.info_.skipped.push_back(ck_.original_name_.at(name));
  }
}

// ------------------------------------------------------------------------------------------ Checkpoint

// The MTP head is loaded where the checkpoint ships it (mtp.fc present): as deep as a Qwen3.5
// config's mtp_num_hidden_layers says, one layer for Qwen3-Next, whose configs have no such key.
// Conversions that drop the head keep the key, and load without it.
void Checkpoint::choose_mtp_layers(const std::string& cfg_path) {
  ModelConfig& c = config_;
  if (!tensors_.count("mtp.fc.weight")) c.mtp_layers = 0;
  else if (c.arch == Arch::Qwen3Next) c.mtp_layers = 1;
  check(c.mtp_layers <= 1, cfg_path + ": mtp_num_hidden_layers is " + std::to_string(c.mtp_layers) +
                               "; heads of more than one layer are not supported (expected 0 or 1)");
}

void Checkpoint::open_files() {
  const fs::path d(dir_);
  std::vector<std::string> paths;
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    const json j = parse_checkpoint_json(index.string(), in);
    check(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
          index.string() + ": field 'weight_map' is missing (expected an object of tensor -> file)");
    std::set<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
      check(file.is_string() && plain_file_name(file.get<std::string>()),
            index.string() + ": weight_map entry '" + name + "' must name a file in " + dir_ + ", found " + file.dump());
      files.insert(file.get<std::string>());
    }
    for (const auto& f : files) {
      std::error_code ec;
      check(fs::is_regular_file(d / f, ec), index.string() + ": lists shard '" + f + "', which is missing from " + dir_);
      paths.push_back((d / f).string());
    }
  } else {
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end());
  }
  check(!paths.empty(), dir_ + ": no .safetensors files found");
  for (const auto& p : paths) files_.push_back(std::make_unique<SafetensorsFile>(p));
  for (const auto& f : files_) {
    for (const auto& [name, t] : f->tensors()) {
      bool skip = false;
      for (const char* s : kSkippedPrefixes) skip = skip || starts_with(name, s);
      if (skip) {
        info_.skipped.push_back(name);
        continue;
      }
      const bool gptq_or_awq = quant_.method == QuantMethod::Gptq || quant_.method == QuantMethod::Awq;
      if (ends_with(name, ".scales") && !gptq_or_awq) info_.format = CheckpointFormat::Mlx;
      refuse_foreign_quant_tensor(f->path(), name, quant_.method);
      const std::string canon = canonical_name(name);
      check(!tensors_.count(canon), f->path() + ": tensor '" + name + "' appears twice (also as '" +
                                        original_name_[canon] + "')");
      tensors_[canon] = &t;
      original_name_[canon] = name;
    }
  }
}

void Checkpoint::page_in(const LoadProgress& progress) {
  std::set<const uint8_t*> repacked;
  size_t total = 0, done = 0;
  for (const Repack& r : repacks_)
    for (const auto& s : r.sources) {
      repacked.insert(s.data());
      total += s.size();
    }
  std::vector<std::span<const uint8_t>> spans;
  for (const auto& f : files_)
    for (const auto& [n, t] : f->tensors())
      if (!repacked.count(t.data)) spans.emplace_back(t.data, t.nbytes);
  if (gguf_)
    for (const auto& f : gguf_->files())
      for (const GgufTensor& t : f->tensors()) spans.emplace_back(t.data, t.nbytes);
  for (const auto& s : spans) total += s.size();
  volatile uint8_t sink = 0;
  for (const auto& s : spans) {
    for (size_t o = 0; o < s.size(); o += 4096) sink = sink + s[o];  // touch every page once
    done += s.size();
    if (progress) progress(done, total);
  }
  for (const Repack& r : repacks_) {
    r.run();
    for (const auto& s : r.sources) done += s.size();
    if (progress) progress(done, total);
  }
  repacks_.clear();
}

// Totals for `petrel inspect` and the load summary.
void Checkpoint::count_parameters() {
  CheckpointInfo& info = info_;
  const ModelConfig& c = config_;
  auto add = [&](const Matrix& m, double active_fraction) {
    if (!m.valid()) return;
    info.weight_bytes += m.bytes();
    info.parameters += m.rows * m.cols;
    info.active_parameters += int64_t(double(m.rows * m.cols) * active_fraction);
  };
  const ModelWeights& W = weights_;
  add(W.embed, 0.0);
  if (W.lm_head.data != W.embed.data) add(W.lm_head, 1.0);
  const double expert_frac = c.n_experts ? double(c.top_k) / c.n_experts : 0.0;
  // `active`: whether plain decoding reads the layer for every token (the MTP head's it does not).
  auto add_layer = [&](const LayerWeights& L, bool active) {
    for (const Matrix* m : {&L.attn.q, &L.attn.gate, &L.attn.k, &L.attn.v, &L.attn.o, &L.gdn.qkv, &L.gdn.z,
                            &L.gdn.b, &L.gdn.a, &L.gdn.out, &L.ffn.router, &L.ffn.shared_gate, &L.ffn.dense.gate,
                            &L.ffn.dense.up, &L.ffn.dense.down, &L.ffn.shared.gate, &L.ffn.shared.up,
                            &L.ffn.shared.down})
      add(*m, active ? 1.0 : 0.0);
    for (const auto& e : L.ffn.experts)
      for (const Matrix* m : {&e.gate, &e.up, &e.down}) add(*m, active ? expert_frac : 0.0);
  };
  for (const auto& L : W.layers) add_layer(L, true);
  add(W.mtp.fc, 0.0);
  for (const auto& L : W.mtp.layers) add_layer(L, false);
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir, const LoadProgress& progress) {
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  if (is_gguf_file(dir)) {
    ck->open_gguf();
    ck->page_in(progress);
    ck->count_parameters();
    return ck;
  }
  check_checkpoint_folder(dir);
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const json root = read_hf_config_json(cfg_path);
  ck->config_ = parse_hf_config(root, cfg_path);
  ck->quant_ = parse_quant_config(root, cfg_path);
  ck->open_files();
  ck->choose_mtp_layers(cfg_path);
  int quant_bits = 0;
  if (ck->info_.format == CheckpointFormat::Mlx) {
    check(ck->quant_.method == QuantMethod::MlxAffine,
          cfg_path + ": tensors carry .scales (MLX quantized) but config.json has no 'quantization' field giving bits "
                     "and group_size");
    quant_bits = quant_field(ck->quant_.mlx, "bits", 4, cfg_path + ": quantization");
  }
  WeightMapper(*ck).run();
  ck->page_in(progress);
  ck->count_parameters();

  CheckpointInfo& info = ck->info_;
  const ModelWeights& W = ck->weights_;
  if (info.format == CheckpointFormat::Mlx) {
    info.format_name = "mlx-" + std::to_string(quant_bits) + "bit";
  } else if (ck->quant_.method == QuantMethod::Fp8) {
    info.format_name = "hf-fp8";
  } else if (ck->quant_.method == QuantMethod::Gptq || ck->quant_.method == QuantMethod::Awq) {
    const QuantConfig& q = ck->quant_;
    info.format_name = std::string(q.method == QuantMethod::Gptq ? "gptq " : "awq ") + std::to_string(q.bits) +
                       "-bit, " + (q.group_size == -1 ? "one group per row" : "group " + std::to_string(q.group_size));
  } else if (W.embed.dtype == DType::F32) {
    info.format_name = "hf-f32";
  } else if (W.embed.dtype == DType::F16) {
    info.format_name = "hf-f16";
  } else {
    info.format_name = "hf-bf16";
  }
  return ck;
}

}  // namespace petrel
