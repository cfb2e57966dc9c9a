// A fixture checkpoint on the CUDA backend (GPU tests only; callers skip where there is no GPU).
#pragma once
#include <memory>
#include <string>

#include "../unit/test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel::test {

struct CudaFixtureModel {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;

  // graphs = false: every step runs its kernels directly (the reference for recorded steps).
  explicit CudaFixtureModel(const std::string& name, bool graphs = true) : ck(Checkpoint::open(fixture_model(name))) {
    CudaOptions o;
    o.progress = false;
    o.graphs = graphs;
    backend = make_cuda_backend(o);
    model = std::make_unique<Model>(ck->config(), ck->weights(), *backend);
  }
  int vocab() const { return ck->config().vocab; }
};

}  // namespace petrel::test
