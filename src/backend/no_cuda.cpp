// Compiled only into builds without a CUDA compiler: the CUDA backend reports itself absent.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_trace.h"
#include "core/error.h"

namespace petrel {

bool cuda_available() { return false; }
std::string cuda_device_summary() { return "this build has no CUDA backend (nvcc was not found)"; }
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions&) {
  throw Error("--device cuda: this build has no CUDA backend (rebuild on a machine with nvcc)");
}

double cuda_copy_bandwidth() { throw Error("this build has no CUDA backend"); }

// `petrel bench --breakdown` asks for kernel traces; without CUDA there are none.
bool cuda::KernelTrace::available() { return false; }
void cuda::KernelTrace::start() { throw Error("kernel trace: this build has no CUDA backend"); }
std::vector<cuda::KernelRecord> cuda::KernelTrace::stop() { return {}; }

}  // namespace petrel
