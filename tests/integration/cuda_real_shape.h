// The whole-model check of the real-shape GPU tests (cuda_ops_test, cuda_gguf_test): random weights
// at Qwen3.5-35B-A3B's layer dimensions, a fresh 100-token prompt, then 3 decode steps (the GPU
// replays a recorded graph after the first), CPU and CUDA logits compared position by position.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "runtime/forward.h"

namespace petrel::test {

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
