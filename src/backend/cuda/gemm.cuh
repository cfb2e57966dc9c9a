// The prefill GEMM on tensor cores (gemm.cu): y = x · Wᵀ for many rows, dense or grouped by expert.
#pragma once
#include "backend/cuda/common.cuh"

namespace petrel::cuda {

// y[m] = x[src(m)] · Wᵀ for m < M. Dense (row_token and tile_expert null): src(m) = m. Grouped:
// src(m) = row_token[m] (-1: a zero row), the m-tile i of kGemmTileM rows uses stack entry
// tile_expert[i] (-1: skipped). x is bf16 or fp32 (x_elem 2 / 4), y bf16 or fp32 (y_elem).
void gemm(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, int M, const int* row_token,
          const int* tile_expert, void* y, int64_t y_stride, int y_elem, cudaStream_t s);

}  // namespace petrel::cuda
