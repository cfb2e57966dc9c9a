#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace petrel {
namespace {

float* ptr(const Tensor& t) { return static_cast<float*>(t.data); }
float* row(const Tensor& t, int64_t r) { return ptr(t) + r * t.stride; }

// Caches and recurrent state of one sequence, indexed by layer (unused slots stay empty).
class CpuSequence final : public SequenceState {
 public:
  std::vector<std::vector<float>> k, v;  // [n_past, Hkv·D] per attention layer
  std::vector<std::vector<float>> conv;  // [K-1, C] per DeltaNet layer
  std::vector<std::vector<float>> S;     // [Hv, dk, dv] fp32 per DeltaNet layer

  void copy_from(const SequenceState& other) override {
    const auto& o = dynamic_cast<const CpuSequence&>(other);
    check(o.n_past <= capacity, "copy_from: " + std::to_string(o.n_past) + " tokens exceed the capacity of " +
                                    std::to_string(capacity));
    k = o.k;
    v = o.v;
    conv = o.conv;
    S = o.S;
    n_past = o.n_past;
  }

  size_t bytes() const override {
    size_t n = 0;
    for (const auto* part : {&k, &v, &conv, &S})
      for (const auto& layer : *part) n += layer.size() * sizeof(float);
    return n;
  }

  void reset() override {
    for (auto* cache : {&k, &v})
      for (auto& layer : *cache) layer.clear();
    for (auto* state : {&conv, &S})
      for (auto& layer : *state) std::fill(layer.begin(), layer.end(), 0.0f);
    n_past = 0;
  }

  bool dump_state(std::vector<float>& out) const override {
    for (const auto* part : {&k, &v, &conv, &S})
      for (const auto& layer : *part) out.insert(out.end(), layer.begin(), layer.end());
    return true;
  }
};


}  // namespace

CpuBackend::CpuBackend(const CpuOptions& options) : threads_(options.threads) {}

// OpenMP keeps the thread count per calling thread, and a server runs the model on its scheduler
// thread rather than the one that built the backend, so every step sets it where it runs.
void CpuBackend::use_threads() const {
  if (threads_ > 0) omp_set_num_threads(threads_);
}

// Each OpenMP master thread keeps its own team. Once the teams' threads outnumber the cores,
// libgomp stops spinning between parallel regions and every region pays futex wake-ups: a team
// the calling thread keeps idle while a scheduler thread runs the steps made serving on 2 cores
// 2.7x slower than the same steps on one thread's team (petrel-tiny, one stream: 202 against 544
// tokens/s). Pausing frees this thread's team; a later parallel region here makes a new one.
void CpuBackend::release_calling_thread() { omp_pause_resource_all(omp_pause_soft); }

void CpuBackend::prepare(const ModelConfig& config, const ModelWeights&) { config_ = config; }

Tensor CpuBackend::alloc(int64_t rows, int64_t cols, bool) {
  buffers_.emplace_back(size_t(rows * cols), 0.0f);
  Tensor t;
  t.data = buffers_.back().data();
  t.rows = rows;
  t.cols = cols;
  t.stride = cols;
  t.elem_size = 4;
  return t;
}

std::unique_ptr<SequenceState> CpuBackend::new_sequence(int capacity) {
  auto s = std::make_unique<CpuSequence>();
  const ModelConfig& c = config_;
  s->capacity = capacity;
  s->k.resize(c.n_layers);
  s->v.resize(c.n_layers);
  s->conv.resize(c.n_layers);
  s->S.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    if (c.layer_kinds[i] != LayerKind::DeltaNet) continue;
    s->conv[i].assign(size_t(c.conv_kernel - 1) * c.gdn_conv_channels(), 0.0f);
    s->S[i].assign(size_t(c.lin_v_heads) * c.lin_k_dim * c.lin_v_dim, 0.0f);
  }
  return s;
}

// KV caches grow as tokens arrive, so the head's state only needs slots for its layer indices.
std::unique_ptr<SequenceState> CpuBackend::new_mtp_sequence(int capacity) {
  auto s = std::make_unique<CpuSequence>();
  const int layers = config_.n_layers + config_.mtp_layers;
  s->capacity = capacity;
  s->k.resize(layers);
  s->v.resize(layers);
  return s;
}

void CpuBackend::to_host(const Tensor& t, float* dst) {
  for (int64_t r = 0; r < t.rows; ++r) std::memcpy(dst + r * t.cols, row(t, r), sizeof(float) * t.cols);
}

void CpuBackend::from_host(const float* src, Tensor t) {
  for (int64_t r = 0; r < t.rows; ++r) std::memcpy(row(t, r), src + r * t.cols, sizeof(float) * t.cols);
}

void CpuBackend::begin_forward(const int32_t* ids, int n, const SequenceState& st) {
  use_threads();
  ids_.assign(ids, ids + n);
  positions_.resize(size_t(n));
  std::iota(positions_.begin(), positions_.end(), st.n_past);
}

void CpuBackend::begin_batch(const int32_t* ids, SequenceState* const* seqs, int B, const StepPiece* pieces,
                             int n_pieces) {
  use_threads();
  positions_.clear();
  for (int i = 0; i < n_pieces; ++i)
    for (int t = 0; t < pieces[i].rows; ++t) positions_.push_back(pieces[i].state->n_past + t);
  for (int b = 0; b < B; ++b) positions_.push_back(seqs[b]->n_past);
  ids_.assign(ids, ids + positions_.size());
}

void CpuBackend::argmax(const Tensor& logits) {
  const float* p = ptr(logits);
  greedy_ = int32_t(std::max_element(p, p + logits.cols) - p);
}

void CpuBackend::embed(const Matrix& table, Tensor out) {
  const int32_t* ids = ids_.data();
  for (int t = 0; t < int(ids_.size()); ++t) {
    check(ids[t] >= 0 && ids[t] < table.rows, "token id " + std::to_string(ids[t]) + " at position " +
                                                  std::to_string(t) + " is outside the vocabulary (0.." +
                                                  std::to_string(table.rows - 1) + ")");
    table.dequant_row(ids[t], row(out, t));
  }
}

void CpuBackend::rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor out) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < x.rows; ++t) cpu::rms_norm(row(x, t), w.data(), x.cols, eps, row(out, t));
}

void CpuBackend::linear(const Tensor& x, const Matrix& w, Tensor out) {
  cpu::linear(ptr(x), x.stride, x.rows, w, ptr(out), out.stride);
}

void CpuBackend::add(Tensor h, const Tensor& a) {
  for (int64_t t = 0; t < h.rows; ++t) {
    float* hr = row(h, t);
    const float* ar = row(a, t);
    for (int64_t i = 0; i < h.cols; ++i) hr[i] += ar[i];
  }
}

void CpuBackend::qk_norm_rope(Tensor q, Tensor k, const AttentionWeights& w) {
  const ModelConfig& c = config_;
  const int D = c.head_dim;
  for (int64_t t = 0; t < q.rows; ++t) {
    const int pos = positions_[size_t(t)];
    for (int h = 0; h < c.n_heads; ++h) {
      float* qh = row(q, t) + h * D;
      cpu::rms_norm(qh, w.q_norm.data(), D, c.rms_eps, qh);
      cpu::rope_neox(qh, c.rotary_dim, pos, c.rope_theta);
    }
    for (int h = 0; h < c.n_kv_heads; ++h) {
      float* kh = row(k, t) + h * D;
      cpu::rms_norm(kh, w.k_norm.data(), D, c.rms_eps, kh);
      cpu::rope_neox(kh, c.rotary_dim, pos, c.rope_theta);
    }
  }
}

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                           SequenceState& st, Tensor out) {
  auto& s = dynamic_cast<CpuSequence&>(st);
  const ModelConfig& c = config_;
  const int T = int(q.rows);
  const int64_t kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  check(st.n_past + T <= st.capacity, "context full: " + std::to_string(st.n_past + T) +
                                          " tokens exceed the sequence capacity of " + std::to_string(st.capacity));
  auto& kc = s.k[layer];
  auto& vc = s.v[layer];
  kc.resize(size_t(st.n_past + T) * kv_width);
  vc.resize(size_t(st.n_past + T) * kv_width);
  for (int t = 0; t < T; ++t) {
    std::memcpy(&kc[(st.n_past + t) * kv_width], row(k, t), sizeof(float) * kv_width);
    std::memcpy(&vc[(st.n_past + t) * kv_width], row(v, t), sizeof(float) * kv_width);
  }
  cpu::attention(ptr(q), q.stride, T, st.n_past, kc.data(), vc.data(), c.n_heads, c.n_kv_heads, c.head_dim,
                 ptr(out), out.stride);
  if (gate)
    for (int t = 0; t < T; ++t)
      for (int64_t i = 0; i < out.cols; ++i) row(out, t)[i] *= cpu::sigmoid(row(*gate, t)[i]);
}

void CpuBackend::deltanet(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                          const DeltaNetWeights& w, int layer, SequenceState& st, Tensor out) {
  auto& s = dynamic_cast<CpuSequence&>(st);
  const ModelConfig& c = config_;
  const int T = int(qkv.rows);
  const cpu::DeltaNetDims d{c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim};
  const int C = c.gdn_conv_channels(), key_dim = c.gdn_key_dim(), value_dim = c.gdn_value_dim();
  std::vector<float> u(size_t(T) * C);
  cpu::causal_conv_silu(ptr(qkv), qkv.stride, T, C, c.conv_kernel, w.conv.data(), s.conv[layer].data(), u.data());

  // Split [q | k | v], L2-normalise q and k per head (eps inside the root), scale q by dk^-1/2.
  std::vector<float> q(size_t(T) * key_dim), k(size_t(T) * key_dim), v(size_t(T) * value_dim);
  const float q_scale = 1.0f / std::sqrt(float(d.dk));
  for (int t = 0; t < T; ++t) {
    const float* ut = &u[size_t(t) * C];
    std::memcpy(&q[size_t(t) * key_dim], ut, sizeof(float) * key_dim);
    std::memcpy(&k[size_t(t) * key_dim], ut + key_dim, sizeof(float) * key_dim);
    std::memcpy(&v[size_t(t) * value_dim], ut + 2 * key_dim, sizeof(float) * value_dim);
    for (int h = 0; h < d.Hk; ++h) {
      float* qh = &q[(size_t(t) * d.Hk + h) * d.dk];
      float* kh = &k[(size_t(t) * d.Hk + h) * d.dk];
      const float qn = 1.0f / std::sqrt(cpu::dot(qh, qh, d.dk) + 1e-6f);
      const float kn = 1.0f / std::sqrt(cpu::dot(kh, kh, d.dk) + 1e-6f);
      for (int i = 0; i < d.dk; ++i) {
        qh[i] *= qn * q_scale;
        kh[i] *= kn;
      }
    }
  }
  std::vector<float> beta(size_t(T) * d.Hv), g(size_t(T) * d.Hv);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < d.Hv; ++j) {
      beta[size_t(t) * d.Hv + j] = cpu::sigmoid(row(b, t)[j]);
      g[size_t(t) * d.Hv + j] = -std::exp(w.A_log[j]) * cpu::softplus(row(a, t)[j] + w.dt_bias[j]);
    }
  std::vector<float> o(size_t(T) * value_dim);
  if (T == 1)
    cpu::delta_rule_recurrent(d, T, q.data(), k.data(), v.data(), beta.data(), g.data(), s.S[layer].data(), o.data());
  else
    cpu::delta_rule_chunked(d, T, q.data(), k.data(), v.data(), beta.data(), g.data(), s.S[layer].data(), o.data());

  // Gated RMSNorm per value head: rmsnorm(o)·w·silu(z), all fp32.
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < d.Hv; ++j) {
      float* oh = &o[(size_t(t) * d.Hv + j) * d.dv];
      float* dst = row(out, t) + j * d.dv;
      const float* zh = row(z, t) + j * d.dv;
      cpu::rms_norm(oh, w.norm.data(), d.dv, c.rms_eps, dst);
      for (int e = 0; e < d.dv; ++e) dst[e] *= cpu::silu(zh[e]);
    }
}

void CpuBackend::mlp(const Tensor& x, const MlpWeights& w, Tensor out) {
  const int64_t T = x.rows, I = w.gate.rows;
  std::vector<float> g(size_t(T * I)), u(size_t(T * I));
  cpu::linear(ptr(x), x.stride, T, w.gate, g.data(), I);
  cpu::linear(ptr(x), x.stride, T, w.up, u.data(), I);
  for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::silu(g[i]) * u[i];
  cpu::linear(g.data(), I, T, w.down, ptr(out), out.stride);
}

void CpuBackend::moe(const Tensor& x, const FfnWeights& w, Tensor out) {
  const ModelConfig& c = config_;
  const int64_t T = x.rows, H = x.cols, E = c.n_experts;
  std::vector<float> logits(size_t(T * E));
  cpu::linear(ptr(x), x.stride, T, w.router, logits.data(), E);

  // Routing: fp32 softmax over all experts, top-k, optional renormalisation.
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(E);  // expert -> (token, weight)
  std::vector<int> order(E);
  for (int64_t t = 0; t < T; ++t) {
    float* l = &logits[t * E];
    const float mx = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += (l[e] = std::exp(l[e] - mx));
    for (int64_t e = 0; e < E; ++e) l[e] = float(l[e] / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + c.top_k, order.end(),
                      [&](int p, int q) { return l[p] > l[q] || (l[p] == l[q] && p < q); });
    float total = 0.0f;
    for (int i = 0; i < c.top_k; ++i) total += l[order[i]];
    for (int i = 0; i < c.top_k; ++i)
      assigned[order[i]].push_back({t, c.norm_topk_prob ? l[order[i]] / total : l[order[i]]});
  }

  for (int64_t t = 0; t < T; ++t) std::fill(row(out, t), row(out, t) + H, 0.0f);
  // Experts in increasing index order, each over the tokens routed to it (rows gathered once).
  for (int64_t e = 0; e < E; ++e) {
    const auto& list = assigned[e];
    if (list.empty()) continue;
    const int64_t n = int64_t(list.size());
    std::vector<float> xe(size_t(n * H)), ye(size_t(n * H));
    for (int64_t i = 0; i < n; ++i) std::memcpy(&xe[i * H], row(x, list[i].first), sizeof(float) * H);
    Tensor xt{xe.data(), n, H, H, 4}, yt{ye.data(), n, H, H, 4};
    mlp(xt, w.experts[e], yt);
    for (int64_t i = 0; i < n; ++i) {
      float* o = row(out, list[i].first);
      for (int64_t h = 0; h < H; ++h) o[h] += list[i].second * ye[i * H + h];
    }
  }
  if (w.has_shared) {
    std::vector<float> ys(size_t(T * H)), sg(static_cast<size_t>(T));
    Tensor yt{ys.data(), T, H, H, 4};
    mlp(x, w.shared, yt);
    cpu::linear(ptr(x), x.stride, T, w.shared_gate, sg.data(), 1);
    for (int64_t t = 0; t < T; ++t) {
      const float gate = cpu::sigmoid(sg[t]);
      float* o = row(out, t);
      for (int64_t h = 0; h < H; ++h) o[h] += gate * ys[t * H + h];
    }
  }
}

}  // namespace petrel
