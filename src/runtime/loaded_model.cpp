#include "runtime/loaded_model.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/progress.h"
#include "model/synthetic.h"

namespace petrel {

LoadedModel load_model(const std::string& dir, const LoadOptions& options) {
  LoadedModel m;
  if (options.progress) {
    ProgressBar bar("loading " + dir);
    m.checkpoint = Checkpoint::open(dir, [&](size_t done, size_t total) { bar.update(done, total); });
  } else {
    m.checkpoint = Checkpoint::open(dir);
  }
  m.backend = make_backend(options);
  if (options.quantize == "fp8") m.fp8 = std::make_unique<Fp8Copy>(m.checkpoint->weights());
  ForwardOptions fwd;
  fwd.max_chunk = options.max_chunk;
  m.model = std::make_unique<Model>(m.checkpoint->config(), m.weights(), *m.backend, fwd);
  return m;
}

void check_synthetic(const std::string& name, const LoadOptions& options) {
  synthetic_config(name);
  check(resolve_device(options.device) == "cuda",
        "synthetic weights (" + name + ") have no host data: they run on CUDA, and " +
            (options.device == "auto" ? "no CUDA GPU is here (" + cuda_device_summary() + ")" : "--device is cpu"));
}

LoadedModel load_synthetic(const std::string& name, const LoadOptions& options, int vocab) {
  check_synthetic(name, options);
  LoadedModel m;
  m.synthetic = name;
  m.synthetic_config = synthetic_config(name);
  m.synthetic_config.mtp_layers = 0;  // a draft head only where one drafts (bench --speculative mtp)
  if (vocab > 0) m.synthetic_config.vocab = vocab;
  m.synthetic_weights = synthetic_weights(m.synthetic_config);
  m.backend = make_backend(options);
  ForwardOptions fwd;
  fwd.max_chunk = options.max_chunk;
  m.model = std::make_unique<Model>(m.synthetic_config, *m.synthetic_weights, *m.backend, fwd);
  return m;
}

std::string resolve_device(const std::string& device) {
  const std::string resolved = device == "auto" ? (cuda_available() ? "cuda" : "cpu") : device;
  check(resolved == "cuda" || resolved == "cpu", "--device '" + device + "' is not known (expected auto, cuda or cpu)");
  return resolved;
}

std::unique_ptr<Backend> make_backend(const LoadOptions& options) {
  const std::string device = resolve_device(options.device);
  check(options.quantize == "none" || options.quantize == "int4" || options.quantize == "fp8",
        "--quantize '" + options.quantize + "' is not supported (expected none, int4 or fp8)");
  if (device == "cuda") {
    CudaOptions cuda;
    cuda.weights = options.quantize == "int4" ? DeviceWeights::Int4 : DeviceWeights::AsStored;
    cuda.graphs = options.cuda_graphs;
    cuda.progress = options.progress;
    return make_cuda_backend(cuda);
  }
  check(options.quantize != "int4", "--quantize int4 applies to --device cuda; the CPU reads weights as stored "
                                    "(or as fp8 with --quantize fp8)");
  CpuOptions cpu;
  cpu.threads = options.threads;
  return std::make_unique<CpuBackend>(cpu);
}

std::string LoadedModel::summary() const {
  const ModelConfig& c = config();
  if (!checkpoint)
    return std::string(arch_name(c.arch)) + ", " + std::to_string(c.n_layers) + " layers, synthetic " + synthetic +
           " (random weights), device " + backend->name();
  const CheckpointInfo& info = checkpoint->info();
  return std::string(arch_name(c.arch)) + ", " + std::to_string(c.n_layers) + " layers, " + info.format_name +
         (fp8 ? " quantized to fp8" : "") + ", " + format_bytes(double(info.weight_bytes)) + " of weights, device " +
         backend->name();
}

}  // namespace petrel
