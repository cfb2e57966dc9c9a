#include "backend/cuda/op_timer.h"

#include <algorithm>

#include "backend/cuda/common.cuh"

namespace petrel::cuda {

OpTimer::~OpTimer() {
  for (Record& r : records_) {
    cudaEventDestroy(r.begin);
    cudaEventDestroy(r.end);
  }
}

int OpTimer::start(std::string label, cudaStream_t stream) {
  if (used_ == records_.size()) {
    Record r;
    PETREL_CUDA(cudaEventCreate(&r.begin));
    PETREL_CUDA(cudaEventCreate(&r.end));
    records_.push_back(r);
  }
  Record& r = records_[used_];
  r.label = std::move(label);
  PETREL_CUDA(cudaEventRecord(r.begin, stream));
  return int(used_++);
}

void OpTimer::stop(int record, cudaStream_t stream) { PETREL_CUDA(cudaEventRecord(records_[record].end, stream)); }

std::vector<std::pair<std::string, double>> OpTimer::take(cudaStream_t stream) {
  PETREL_CUDA(cudaStreamSynchronize(stream));
  std::vector<std::pair<std::string, double>> totals;
  for (size_t i = 0; i < used_; ++i) {
    float ms = 0.0f;
    PETREL_CUDA(cudaEventElapsedTime(&ms, records_[i].begin, records_[i].end));
    auto it = std::find_if(totals.begin(), totals.end(), [&](const auto& t) { return t.first == records_[i].label; });
    if (it == totals.end()) totals.emplace_back(records_[i].label, ms * 1e-3);
    else it->second += ms * 1e-3;
  }
  used_ = 0;
  return totals;
}

}  // namespace petrel::cuda
