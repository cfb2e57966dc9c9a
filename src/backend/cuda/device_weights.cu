#include "backend/cuda/device_weights.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <utility>

#include "backend/cuda/kernels.cuh"
#include "core/progress.h"

namespace petrel::cuda {
namespace {

constexpr size_t kStagingBytes = 64ull << 20;
constexpr int kQuantGroup = 64;

size_t matrix_bytes(WFormat f, int64_t rows, int64_t cols, int group) {
  if (f == WFormat::BF16) return size_t(rows * cols) * 2;
  const int bits = f == WFormat::Q4 || f == WFormat::I4 ? 4 : 8;
  return size_t(rows * cols * bits / 8) + 2 * size_t(rows * (cols / group)) * 2;
}

// Columns of an MoE block's router sums (RouteSums): the experts and the shared gate, padded to
// whole 16-byte rows.
int route_ld(const FfnWeights& f) { return (int(f.router.rows) + 1 + 7) / 8 * 8; }
bool routes_beside(const LayerWeights& L) { return L.ffn.moe && L.ffn.router.rows > 0 && L.ffn.router.cols % 8 == 0; }

// The device group of an FP8 matrix: the widest of 128, 64, 32 and 16 columns that divides its
// width and its scale blocks' width (so a group lies in one block); 0 where none does (it goes up
// as bf16 then).
int fp8_group(const Matrix& m) {
  for (int g : {128, 64, 32, 16})
    if (m.cols % g == 0 && m.fp8.block_cols % g == 0) return g;
  return 0;
}

// A scale as the two bf16 parts of WFormat::F8 and I4: its rounding to bf16, then what that
// rounding left out.
std::pair<uint16_t, uint16_t> split_scale(float s) {
  const uint16_t hi = f32_to_bf16(s);
  return {hi, f32_to_bf16(s - bf16_to_f32(hi))};
}

// The affine form of a GGUF block matrix; bits 0 for any other matrix.
GgmlAffineForm ggml_gguf_affine(const Matrix& m) {
  return m.format == MatrixFormat::Gguf ? ggml_affine_form(m.ggml) : GgmlAffineForm{};
}

// The trunk's decoder layers, then the multi-token prediction head's.
std::vector<const LayerWeights*> every_layer(const ModelWeights& w) {
  std::vector<const LayerWeights*> out;
  for (const auto* layers : {&w.layers, &w.mtp.layers})
    for (const LayerWeights& L : *layers) out.push_back(&L);
  return out;
}

// Calls fn(matrix, router_like) for every non-expert matrix of the model.
void for_each_matrix(const ModelWeights& w, const std::function<void(const Matrix&, bool)>& fn) {
  fn(w.embed, false);
  fn(w.lm_head, false);
  if (w.mtp.fc.rows > 0) fn(w.mtp.fc, false);
  for (const LayerWeights* layer : every_layer(w)) {
    const LayerWeights& L = *layer;
    for (const Matrix* m : {&L.attn.q, &L.attn.gate, &L.attn.k, &L.attn.v, &L.attn.o, &L.gdn.qkv, &L.gdn.z, &L.gdn.b,
                            &L.gdn.a, &L.gdn.out, &L.ffn.dense.gate, &L.ffn.dense.up, &L.ffn.dense.down,
                            &L.ffn.shared.gate, &L.ffn.shared.up, &L.ffn.shared.down})
      if (m->rows > 0) fn(*m, false);
    for (const Matrix* m : {&L.ffn.router, &L.ffn.shared_gate})
      if (m->rows > 0) fn(*m, true);
  }
}

}  // namespace

void check_device_memory(size_t bytes, const std::string& what) {
  size_t free_b = 0, total_b = 0;
  PETREL_CUDA(cudaMemGetInfo(&free_b, &total_b));
  check(bytes <= free_b, "not enough GPU memory for " + what + ": needs " + format_bytes(double(bytes)) + ", " +
                             format_bytes(double(free_b)) + " free of " + format_bytes(double(total_b)) +
                             " (try --quantize int4, a shorter context, or a smaller --chunk)");
}

DeviceWeights::Plan DeviceWeights::plan(const Matrix& m, bool router_like) const {
  if (m.format == MatrixFormat::Affine) return {&m, m.bits == 4 ? WFormat::Q4 : WFormat::Q8, m.group};
  // GGUF blocks keep their own codes, scales and biases (never quantised twice).
  if (const GgmlAffineForm a = ggml_gguf_affine(m); a.bits > 0) return {&m, a.bits == 4 ? WFormat::Q4 : WFormat::Q8, a.group};
  // IQ4 and FP8 keep their codes and scales, unless --quantize int4 asks for MLX's 4 bits.
  if (m.format == MatrixFormat::Gguf && ggml_is_iq4(m.ggml) && !opt_.int4) return {&m, WFormat::I4, 32};
  if (m.format == MatrixFormat::Fp8 && !opt_.int4 && fp8_group(m) > 0) return {&m, WFormat::F8, fp8_group(m)};
  if (opt_.int4 && m.cols % kQuantGroup == 0) return {&m, router_like ? WFormat::Q8 : WFormat::Q4, kQuantGroup};
  return {&m, WFormat::BF16, kQuantGroup};
}

void* DeviceWeights::device_alloc(size_t bytes) {
  void* p = nullptr;
  PETREL_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  allocations_.push_back(p);
  return p;
}

DeviceMatrix DeviceWeights::allocate(const Plan& p, int count) {
  DeviceMatrix d;
  d.format = p.format;
  d.rows = int(p.m->rows);
  d.cols = int(p.m->cols);
  d.group = p.group;
  d.count = count;
  check(d.cols % 8 == 0, p.m->name + ": input width " + std::to_string(d.cols) +
                             " is not a multiple of 8, which the CUDA kernels require");
  if (p.format == WFormat::BF16) {
    d.w_stride = int64_t(d.rows) * d.cols;
    d.w = device_alloc(size_t(d.w_stride * count) * 2);
  } else {
    d.w_stride = int64_t(d.rows) * d.cols * d.bits() / 32;
    d.s_stride = int64_t(d.rows) * (d.cols / d.group);
    d.w = device_alloc(size_t(d.w_stride * count) * 4);
    d.scales = static_cast<bf16*>(device_alloc(size_t(d.s_stride * count) * 2));
    d.biases = static_cast<bf16*>(device_alloc(size_t(d.s_stride * count) * 2));
  }
  bytes_ += matrix_bytes(p.format, d.rows, d.cols, d.group) * count;
  return d;
}

void DeviceWeights::upload_rows(int64_t rows, size_t row_bytes, const std::function<void(int64_t, uint8_t*)>& row,
                                void* dst) {
  const int64_t batch = std::max<int64_t>(1, int64_t(staging_bytes_ / row_bytes));
  for (int64_t r0 = 0; r0 < rows; r0 += batch) {
    const int64_t n = std::min(batch, rows - r0);
    for (int64_t r = 0; r < n; ++r) row(r0 + r, staging_ + r * row_bytes);
    PETREL_CUDA(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + r0 * row_bytes, staging_, n * row_bytes,
                                cudaMemcpyHostToDevice, stream_));
    PETREL_CUDA(cudaStreamSynchronize(stream_));  // the staging buffer is reused next
    done_ += n * row_bytes;
    if (progress_) progress_(std::min(done_, planned_), planned_);
  }
}

// A matrix of codes with two bf16 values per group, a batch of rows at a time through the staging
// buffer: unpack(r, codes, first, second) writes logical row r's code words and each group's
// two values (scale and bias; F8 and I4: the two parts of the scale, split_scale).
void DeviceWeights::upload_coded_rows(const Matrix& m, const DeviceMatrix& dst, const UnpackRow& unpack) {
  const int64_t words = int64_t(m.cols) * dst.bits() / 32, groups = m.cols / dst.group;
  const size_t row_bytes = size_t(words) * 4 + size_t(groups) * 4;
  const int64_t batch = std::max<int64_t>(1, int64_t(staging_bytes_ / row_bytes));
  for (int64_t r0 = 0; r0 < m.rows; r0 += batch) {
    const int64_t n = std::min(batch, m.rows - r0);
    uint32_t* codes = reinterpret_cast<uint32_t*>(staging_);
    uint16_t* first = reinterpret_cast<uint16_t*>(codes + n * words);
    uint16_t* second = first + n * groups;
    for (int64_t r = 0; r < n; ++r) unpack(r0 + r, codes + r * words, first + r * groups, second + r * groups);
    const auto put = [&](void* to, const void* from, size_t bytes) {
      PETREL_CUDA(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, stream_));
    };
    put(static_cast<uint32_t*>(const_cast<void*>(dst.w)) + r0 * words, codes, size_t(n * words) * 4);
    put(const_cast<bf16*>(dst.scales) + r0 * groups, first, size_t(n * groups) * 2);
    put(const_cast<bf16*>(dst.biases) + r0 * groups, second, size_t(n * groups) * 2);
    PETREL_CUDA(cudaStreamSynchronize(stream_));  // the staging buffer is reused next
    done_ += size_t(n) * row_bytes;
    if (progress_) progress_(std::min(done_, planned_), planned_);
  }
}

// A GGUF block matrix as the affine codes, scales and biases its type's blocks hold
// (ggml_affine_row). Scales and biases go up as bf16, which keeps each weight as precise as a
// bf16 weight would be.
void DeviceWeights::fill_gguf_affine(const Matrix& m, const DeviceMatrix& dst) {
  const size_t raw_row = size_t(ggml_row_bytes(m.ggml, m.cols));
  std::vector<float> scales(size_t(m.cols / dst.group)), biases(scales.size());
  upload_coded_rows(m, dst, [&](int64_t r, uint32_t* codes, uint16_t* s16, uint16_t* b16) {
    const uint8_t* row = static_cast<const uint8_t*>(m.data) + size_t(m.stored_row(r)) * raw_row;
    ggml_affine_row(m.ggml, row, m.cols, codes, scales.data(), biases.data());
    for (size_t g = 0; g < scales.size(); ++g) {
      s16[g] = f32_to_bf16(scales[g]);
      b16[g] = f32_to_bf16(biases[g]);
    }
  });
}

// An IQ4_NL / IQ4_XS matrix as its 4-bit codes and each group of 32's scale in two parts
// (WFormat::I4).
void DeviceWeights::fill_gguf_iq4(const Matrix& m, const DeviceMatrix& dst) {
  const size_t raw_row = size_t(ggml_row_bytes(m.ggml, m.cols));
  std::vector<float> scales(size_t(m.cols / 32));
  upload_coded_rows(m, dst, [&](int64_t r, uint32_t* codes, uint16_t* hi, uint16_t* lo) {
    const uint8_t* row = static_cast<const uint8_t*>(m.data) + size_t(m.stored_row(r)) * raw_row;
    ggml_iq4_row(m.ggml, row, m.cols, codes, scales.data());
    for (size_t g = 0; g < scales.size(); ++g) std::tie(hi[g], lo[g]) = split_scale(scales[g]);
  });
}

// An FP8 matrix's codes as stored (rows gathered) and each device group's block scale in two parts
// (WFormat::F8).
void DeviceWeights::fill_fp8(const Matrix& m, const DeviceMatrix& dst) {
  const int64_t cols = m.cols, groups = cols / dst.group;
  upload_coded_rows(m, dst, [&](int64_t r, uint32_t* codes, uint16_t* hi, uint16_t* lo) {
    const int64_t sr = m.stored_row(r);
    std::memcpy(codes, static_cast<const uint8_t*>(m.data) + sr * cols, size_t(cols));
    for (int64_t g = 0; g < groups; ++g) {
      const float s = m.fp8_scale(sr, g * dst.group);
      // The kernels multiply the scale by 2^120 in fp32 (e4m3_top).
      check(std::fabs(s) < 256.0f, m.name + ": FP8 block scale " + std::to_string(s) +
                                       " is out of the range the CUDA kernels take (below 256)");
      std::tie(hi[g], lo[g]) = split_scale(s);
    }
  });
}

// Writes one matrix (already allocated as `dst`) from the host view, or random values when the
// view has no data (synthetic benchmark models).
void DeviceWeights::fill(const Plan& p, const DeviceMatrix& dst) {
  const Matrix& m = *p.m;
  const int64_t rows = m.rows, cols = m.cols;
  if (m.data == nullptr) {
    const uint64_t seed = uint64_t(reinterpret_cast<uintptr_t>(&m));
    const float scale = std::sqrt(3.0f / float(cols));
    if (dst.format == WFormat::BF16) {
      fill_random_bf16(static_cast<bf16*>(const_cast<void*>(dst.w)), rows * cols, scale, seed, stream_);
    } else if (dst.format == WFormat::F8 || dst.format == WFormat::I4) {
      // Codes of RMS ~65 (FP8: even exponents, never NaN; IQ4's levels: ~67) under scales of ~1/65
      // the bf16 weights' RMS, as one part (the other zero).
      const uint32_t mask = dst.format == WFormat::F8 ? 0xF7F7F7F7u : ~0u;
      fill_random_u32(static_cast<uint32_t*>(const_cast<void*>(dst.w)), dst.w_stride, seed, stream_, mask);
      fill_random_bf16(const_cast<bf16*>(dst.scales), dst.s_stride, 2.0f * scale / std::sqrt(3.0f) / 65.0f, seed + 1,
                       stream_);
      PETREL_CUDA(cudaMemsetAsync(const_cast<bf16*>(dst.biases), 0, size_t(dst.s_stride) * 2, stream_));
    } else {
      fill_random_u32(static_cast<uint32_t*>(const_cast<void*>(dst.w)), dst.w_stride, seed, stream_);
      const float step = 2.0f * scale / float((1 << dst.bits()) - 1);
      fill_random_bf16(const_cast<bf16*>(dst.scales), dst.s_stride, step, seed + 1, stream_);
      fill_random_bf16(const_cast<bf16*>(dst.biases), dst.s_stride, scale, seed + 2, stream_);
    }
    done_ += matrix_bytes(dst.format, rows, cols, dst.group);
    if (progress_) progress_(std::min(done_, planned_), planned_);
    return;
  }
  auto bf16_row = [&](int64_t r, uint8_t* out) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
    if (m.format == MatrixFormat::Dense && m.dtype == DType::BF16) {
      std::memcpy(o, static_cast<const uint8_t*>(m.data) + m.stored_row(r) * cols * 2, cols * 2);
      return;
    }
    std::vector<float> f(cols);
    m.dequant_row(r, f.data());
    for (int64_t i = 0; i < cols; ++i) o[i] = f32_to_bf16(f[i]);
  };
  if (ggml_gguf_affine(m).bits > 0) return fill_gguf_affine(m, dst);
  if (dst.format == WFormat::F8) return fill_fp8(m, dst);
  if (dst.format == WFormat::I4) return fill_gguf_iq4(m, dst);
  // Dense, FP8 and the other GGUF block rows go up as bf16 (decoded row by row), or quantised at load.
  if (m.format != MatrixFormat::Affine) {
    if (dst.format == WFormat::BF16) {
      upload_rows(rows, cols * 2, bf16_row, const_cast<void*>(dst.w));
      return;
    }
    // Quantise at load: bf16 rows to a temporary device buffer, then MLX's scheme on the device.
    bf16* tmp = nullptr;
    PETREL_CUDA(cudaMalloc(&tmp, size_t(rows * cols) * 2));
    upload_rows(rows, cols * 2, bf16_row, tmp);
    quantize_affine(tmp, int(rows), int(cols), dst.bits(), dst.group, static_cast<uint32_t*>(const_cast<void*>(dst.w)),
                    const_cast<bf16*>(dst.scales), const_cast<bf16*>(dst.biases), stream_);
    PETREL_CUDA(cudaStreamSynchronize(stream_));
    PETREL_CUDA(cudaFree(tmp));
    return;
  }
  // Affine codes as stored (rows gathered), scales and biases as bf16.
  const int64_t words = cols * m.bits / 32, groups = cols / m.group;
  upload_rows(rows, words * 4, [&](int64_t r, uint8_t* out) {
    std::memcpy(out, static_cast<const uint32_t*>(m.data) + m.stored_row(r) * words, words * 4);
  }, const_cast<void*>(dst.w));
  for (int part = 0; part < 2; ++part) {
    const void* src = part == 0 ? m.scales : m.biases;
    upload_rows(rows, groups * 2, [&](int64_t r, uint8_t* out) {
      uint16_t* o = reinterpret_cast<uint16_t*>(out);
      for (int64_t g = 0; g < groups; ++g) o[g] = f32_to_bf16(load_as_f32(src, m.dtype, m.stored_row(r) * groups + g));
    }, const_cast<bf16*>(part == 0 ? dst.scales : dst.biases));
  }
}

void DeviceWeights::add_matrix(const Matrix& m, bool router_like) {
  if (matrices_.count(&m)) return;
  if (m.data && !m.row_map) {
    auto it = by_data_.find(m.data);
    if (it != by_data_.end() && it->second.rows == m.rows && it->second.cols == m.cols) {
      matrices_[&m] = it->second;
      return;
    }
  }
  const Plan p = plan(m, router_like);
  DeviceMatrix d = allocate(p, 1);
  fill(p, d);
  matrices_[&m] = d;
  if (m.data && !m.row_map) by_data_[m.data] = d;
}

void DeviceWeights::add_experts(const FfnWeights& f) {
  ExpertStacks s;
  DeviceMatrix* dst[3] = {&s.gate, &s.up, &s.down};
  for (int role = 0; role < 3; ++role) {
    auto pick = [&](const MlpWeights& e) -> const Matrix& { return role == 0 ? e.gate : role == 1 ? e.up : e.down; };
    const Plan first = plan(pick(f.experts[0]), false);
    *dst[role] = allocate(first, int(f.experts.size()));
    for (size_t e = 0; e < f.experts.size(); ++e) {
      const Plan p = plan(pick(f.experts[e]), false);
      check(p.format == first.format && p.group == first.group && p.m->rows == first.m->rows &&
                p.m->cols == first.m->cols,
            p.m->name + ": expert " + std::to_string(e) + " differs in format or shape from expert 0");
      fill(p, dst[role]->entry(int(e)));
    }
  }
  experts_[&f] = s;
}

void DeviceWeights::add_vector(const std::vector<float>& v) {
  if (v.empty() || vectors_.count(&v)) return;
  float* d = static_cast<float*>(device_alloc(v.size() * sizeof(float)));
  PETREL_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  vectors_[&v] = d;
}

DeviceWeights::DeviceWeights(const ModelConfig& config, const ModelWeights& w, const UploadOptions& options,
                             cudaStream_t stream)
    : opt_(options), stream_(stream) {
  (void)config;
  // Plan first, so a model that does not fit fails before anything is copied.
  size_t total = 0;
  for_each_matrix(w, [&](const Matrix& m, bool router_like) {
    const Plan p = plan(m, router_like);
    total += matrix_bytes(p.format, m.rows, m.cols, p.group);
  });
  for (const LayerWeights* L : every_layer(w))
    for (const MlpWeights& e : L->ffn.experts)
      for (const Matrix* m : {&e.gate, &e.up, &e.down}) {
        const Plan p = plan(*m, false);
        total += matrix_bytes(p.format, m->rows, m->cols, p.group);
      }
  for (const LayerWeights* L : every_layer(w))
    if (routes_beside(*L)) total += size_t(L->ffn.router.cols) * route_ld(L->ffn) * 2;
  check_device_memory(total, "the model weights");
  planned_ = total;
  PETREL_CUDA(cudaMallocHost(&staging_, kStagingBytes));
  staging_bytes_ = kStagingBytes;
  ProgressBar bar("uploading weights to the GPU");
  if (opt_.progress) progress_ = [&](size_t done, size_t all) { bar.update(done, all); };
  for_each_matrix(w, [&](const Matrix& m, bool router_like) { add_matrix(m, router_like); });
  for (const LayerWeights* layer : every_layer(w)) {
    const LayerWeights& L = *layer;
    if (!L.ffn.experts.empty()) add_experts(L.ffn);
    for (const std::vector<float>* v : {&L.input_norm, &L.post_norm, &L.attn.q_norm, &L.attn.k_norm, &L.gdn.conv,
                                        &L.gdn.A_log, &L.gdn.dt_bias, &L.gdn.norm})
      add_vector(*v);
  }
  for (const std::vector<float>* v : {&w.final_norm, &w.mtp.embed_norm, &w.mtp.hidden_norm, &w.mtp.norm}) add_vector(*v);
  for (const LayerWeights* L : every_layer(w))
    if (routes_beside(*L)) add_route(*L);
  PETREL_CUDA(cudaStreamSynchronize(stream_));
  progress_ = nullptr;
  if (!opt_.progress) bar.update(bytes_, bytes_);
  PETREL_CUDA(cudaFreeHost(staging_));
  staging_ = nullptr;
}

void DeviceWeights::add_route(const LayerWeights& L) {
  const FfnWeights& f = L.ffn;
  RouteSums r;
  r.ld = route_ld(f);
  r.n = int(f.router.rows) + (f.has_shared ? 1 : 0);
  const size_t bytes = size_t(f.router.cols) * r.ld * 2;
  bf16* cols = static_cast<bf16*>(device_alloc(bytes));
  route_columns(matrix(f.router), f.has_shared ? &matrix(f.shared_gate) : nullptr, vec(L.post_norm), cols, r.ld,
                stream_);
  r.cols = cols;
  bytes_ += bytes;
  routes_[&f] = r;
}

const RouteSums* DeviceWeights::route(const FfnWeights& f) const {
  auto it = routes_.find(&f);
  return it == routes_.end() ? nullptr : &it->second;
}

DeviceWeights::~DeviceWeights() {
  for (void* p : allocations_) cudaFree(p);
  if (staging_) cudaFreeHost(staging_);
}

const DeviceMatrix& DeviceWeights::matrix(const Matrix& m) const {
  auto it = matrices_.find(&m);
  check(it != matrices_.end(), "CUDA backend: weight '" + m.name + "' was not uploaded");
  return it->second;
}

const float* DeviceWeights::vec(const std::vector<float>& v) const {
  auto it = vectors_.find(&v);
  check(it != vectors_.end(), "CUDA backend: a norm/state vector was not uploaded");
  return it->second;
}

const ExpertStacks& DeviceWeights::experts(const FfnWeights& f) const {
  auto it = experts_.find(&f);
  check(it != experts_.end(), "CUDA backend: experts were not uploaded");
  return it->second;
}

}  // namespace petrel::cuda

namespace petrel::cuda {
size_t DeviceMatrix::bytes() const { return matrix_bytes(format, rows, cols, group) * count; }
}  // namespace petrel::cuda
