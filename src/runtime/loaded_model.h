// A checkpoint opened on a backend, ready to run: what every command that runs a model needs.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "model/fp8_quantize.h"
#include "runtime/forward.h"

namespace petrel {

struct LoadOptions {
  std::string device = "auto";  // auto (cuda when a GPU is present), cuda or cpu
  // none; int4 (CUDA: float weights quantised at upload); fp8 (CPU: float weights to block-scaled
  // e4m3 at load, model/fp8_quantize.h)
  std::string quantize = "none";
  bool cuda_graphs = true;
  int threads = 0;        // CPU threads; 0 = all cores
  int max_chunk = 512;    // prefill chunk length
  bool progress = true;   // progress bar on stderr while paging in weights
};

struct LoadedModel {
  std::unique_ptr<Checkpoint> checkpoint;  // null for synthetic weights
  std::string synthetic;                   // the released shape of synthetic weights, else ""
  ModelConfig synthetic_config;
  std::unique_ptr<ModelWeights> synthetic_weights;
  std::unique_ptr<Fp8Copy> fp8;  // with --quantize fp8: the weights the model reads
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;

  const ModelConfig& config() const { return checkpoint ? checkpoint->config() : synthetic_config; }
  const ModelWeights& weights() const {
    return fp8 ? fp8->weights() : checkpoint ? checkpoint->weights() : *synthetic_weights;
  }
  // One line: architecture, format, device, memory.
  std::string summary() const;
};

LoadedModel load_model(const std::string& dir, const LoadOptions& options);
// Random weights of a released shape (model/synthetic.h) on CUDA, for speed work on shapes whose
// checkpoints are not at hand: `petrel serve --synthetic`. `vocab` > 0 replaces the shape's
// vocabulary (that of the tokenizer requests are read with, so that every sampled id decodes).
LoadedModel load_synthetic(const std::string& name, const LoadOptions& options, int vocab = 0);
// What load_synthetic refuses, before anything is loaded: an unknown shape, a device other than CUDA.
void check_synthetic(const std::string& name, const LoadOptions& options);
// The backend LoadOptions ask for (the device resolved, "auto" included).
std::unique_ptr<Backend> make_backend(const LoadOptions& options);
// "cuda" or "cpu" for a --device value ("auto": cuda when a GPU is present); throws on others.
std::string resolve_device(const std::string& device);

}  // namespace petrel
