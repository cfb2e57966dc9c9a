#include "runtime/loaded_model.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/progress.h"

namespace petrel {

LoadedModel load_model(const std::string& dir, const LoadOptions& options) {
  LoadedModel m;
  check(options.device == "cpu", "--device '" + options.device + "' is not available in this build (expected cpu)");
  if (options.progress) {
    ProgressBar bar("loading " + dir);
    m.checkpoint = Checkpoint::open(dir, [&](size_t done, size_t total) { bar.update(done, total); });
  } else {
    m.checkpoint = Checkpoint::open(dir);
  }
  CpuOptions cpu;
  cpu.threads = options.threads;
  m.backend = std::make_unique<CpuBackend>(cpu);
  ForwardOptions fwd;
  fwd.max_chunk = options.max_chunk;
  m.model = std::make_unique<Model>(m.checkpoint->config(), m.checkpoint->weights(), *m.backend, fwd);
  return m;
}

std::string LoadedModel::summary() const {
  const ModelConfig& c = config();
  const CheckpointInfo& info = checkpoint->info();
  return std::string(arch_name(c.arch)) + ", " + std::to_string(c.n_layers) + " layers, " + info.format_name +
         ", " + format_bytes(double(info.weight_bytes)) + " of weights, device " + backend->name();
}

}  // namespace petrel
