// What the real-shape GPU tests (cuda_ops_test, cuda_gguf_test, cuda_fp8_test) share: host-owned
// random weights, a CPU and a CUDA backend for op-by-op comparisons, and the whole-model check: a fresh 100-token prompt, then 3 decode steps (the GPU replays a
// recorded graph after the first), CPU and CUDA logits compared position by position.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <random>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "runtime/forward.h"

// Skips the calling test, saying why, where there is no GPU.
#define REQUIRE_GPU()                                                            \
  do {                                                                           \
    if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary(); \
  } while (0)

namespace petrel::test {

// Host-owned random weights, viewed as canonical Matrices.
struct RandomWeights {
  ModelConfig c;
  ModelWeights w;
  std::deque<std::vector<uint16_t>> bf16_buffers;
  std::deque<std::vector<uint32_t>> word_buffers;
  std::mt19937_64 rng{42};

  uint16_t random_bf16(float scale) {
    const float u = float(rng() >> 40) / float(1 << 24);
    return f32_to_bf16((2.0f * u - 1.0f) * scale);
  }
  Matrix dense(const std::string& name, int64_t rows, int64_t cols, float gain = 1.0f) {
    bf16_buffers.emplace_back(size_t(rows * cols));
    const float scale = gain * std::sqrt(3.0f / float(cols));
    for (auto& v : bf16_buffers.back()) v = random_bf16(scale);
    Matrix m;
    m.name = name;
    m.rows = rows;
    m.cols = cols;
    m.dtype = DType::BF16;
    m.data = bf16_buffers.back().data();
    return m;
  }
  // MLX affine `bits`-bit: random codes, scales and biases spanning the range of dense(..., gain).
  Matrix affine(const std::string& name, int64_t rows, int64_t cols, int bits = 4, int group = 64, float gain = 1.0f) {
    word_buffers.emplace_back(size_t(rows * cols * bits / 32));
    for (auto& v : word_buffers.back()) v = uint32_t(rng());
    const float scale = gain * std::sqrt(3.0f / float(cols));
    bf16_buffers.emplace_back(size_t(rows * cols / group));
    for (auto& v : bf16_buffers.back()) v = f32_to_bf16(2.0f * scale / float((1 << bits) - 1));
    const void* s = bf16_buffers.back().data();
    bf16_buffers.emplace_back(size_t(rows * cols / group));
    for (auto& v : bf16_buffers.back()) v = f32_to_bf16(-scale);
    Matrix m;
    m.name = name;
    m.rows = rows;
    m.cols = cols;
    m.format = MatrixFormat::Affine;
    m.dtype = DType::BF16;
    m.bits = bits;
    m.group = group;
    m.data = word_buffers.back().data();
    m.scales = s;
    m.biases = bf16_buffers.back().data();
    return m;
  }
  std::vector<float> vec(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
  }
};

// max |gpu - cpu| / max |cpu| over two host copies of an output, NaN-safe (a NaN makes it infinite).
inline double max_rel_error(const std::vector<float>& cpu, const std::vector<float>& gpu) {
  double num = 0, den = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double d = std::fabs(double(cpu[i]) - double(gpu[i]));
    if (!(d <= 1e30)) return INFINITY;
    num = std::max(num, d);
    den = std::max(den, std::fabs(double(cpu[i])));
  }
  return num / std::max(den, 1e-30);
}

// A CPU and a CUDA backend prepared with the same weights, for comparing ops one by one.
struct BackendPair {
  CpuBackend cpu;
  std::unique_ptr<Backend> gpu;
  BackendPair(const ModelConfig& c, const ModelWeights& w, int max_tokens = 512) {
    CudaOptions o;
    o.progress = false;
    gpu = make_cuda_backend(o);
    cpu.prepare(c, w);
    gpu->prepare(c, w);
    cpu.reserve(max_tokens);
    gpu->reserve(max_tokens);
  }
};

// One op's fresh bf16-exact inputs on both backends of a pair, and its outputs poisoned with NaN.
struct PairIo {
  BackendPair& p;
  Tensor cx, gx, cy, gy;
  PairIo(BackendPair& pair, int64_t rows, int64_t in, int64_t out) : p(pair) {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(size_t(rows * in));
    for (auto& v : x) v = bf16_to_f32(f32_to_bf16(d(rng)));
    cx = p.cpu.alloc(rows, in);
    gx = p.gpu->alloc(rows, in);
    p.cpu.from_host(x.data(), cx);
    p.gpu->from_host(x.data(), gx);
    cy = p.cpu.alloc(rows, out);
    gy = p.gpu->alloc(rows, out);
    std::vector<float> nan(size_t(rows * out), NAN);
    p.cpu.from_host(nan.data(), cy);
    p.gpu->from_host(nan.data(), gy);
  }
  // max |gpu - cpu| / max |cpu| of the outputs (NaN: infinite).
  double rel_error() {
    std::vector<float> a(size_t(cy.rows * cy.cols)), b(a.size());
    p.cpu.to_host(cy, a.data());
    p.gpu->to_host(gy, b.data());
    return max_rel_error(a, b);
  }
};

// Per-position cosines of CPU against CUDA logits over prompt and decode steps.
inline std::vector<double> real_shape_cosines(const ModelConfig& c, const ModelWeights& w) {
  CpuBackend cpu_backend;
  CudaOptions o;
  o.progress = false;
  auto gpu_backend = make_cuda_backend(o);
  ForwardOptions fo;
  fo.max_chunk = 48;
  Model cpu(c, w, cpu_backend, fo), gpu(c, w, *gpu_backend, fo);
  std::vector<int32_t> ids(100);
  std::mt19937 rng(std::random_device{}());
  for (auto& id : ids) id = int32_t(rng() % uint32_t(c.vocab));
  const int T = int(ids.size()), V = c.vocab;
  std::vector<float> a(size_t(T + 3) * V), b(size_t(T + 3) * V);
  auto cs = cpu.new_sequence(T + 3), gs = gpu.new_sequence(T + 3);
  cpu.forward(ids.data(), T, *cs, nullptr, a.data());
  gpu.forward(ids.data(), T, *gs, nullptr, b.data());
  for (int i = 0; i < 3; ++i) {
    const int32_t next = ids[size_t(i)];
    cpu.forward(&next, 1, *cs, a.data() + size_t(T + i) * V);
    gpu.forward(&next, 1, *gs, b.data() + size_t(T + i) * V);
  }
  return row_cosines(a, b, T + 3, V);
}

// Layer 1's router sees layer 0's output, which carries bf16 rounding; where two experts sit within
// that noise the backends pick different ones and that position's logits move (a discrete effect HF
// bf16 shows against fp32 too). Elsewhere the logits agree to cosine >= 0.999; docs/cuda-backend.md
// has the analysis. Bounds from GPU runs with fresh inputs: 4-24 of 103 positions below 0.999,
// medians 0.99972-0.99985, minima 0.974-0.996; the count's bound sits at 30%, the median and
// minimum bounds catch a real loss of precision.
inline void expect_real_shape_agreement(std::vector<double> cosines, const char* label) {
  const int below = int(std::count_if(cosines.begin(), cosines.end(), [](double c) { return c < 0.999; }));
  std::sort(cosines.begin(), cosines.end());
  std::printf("note: %s cosine min %.6f, median %.6f, %d of %zu positions below 0.999\n", label, cosines[0],
              cosines[cosines.size() / 2], below, cosines.size());
  EXPECT_GE(cosines[cosines.size() / 2], 0.9995) << label;
  EXPECT_LE(below, int(cosines.size()) * 3 / 10) << label;
  EXPECT_GE(cosines[0], 0.95) << label;
}

}  // namespace petrel::test
