#include "backend/cuda/kernel_trace.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

#ifdef PETREL_HAVE_CUPTI
#include <cupti.h>
#include <cxxabi.h>
#endif

namespace petrel::cuda {

#ifdef PETREL_HAVE_CUPTI
namespace {

constexpr size_t kBufferBytes = 8 << 20;

std::mutex g_mutex;
std::vector<KernelRecord> g_records;

void check_cupti(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  throw Error(std::string("CUPTI ") + what + ": " + (msg ? msg : "unknown error"));
}

// "petrel::cuda::(anonymous namespace)::gemv_kernel<(petrel::cuda::WFormat)1, 2>(args)" ->
// "gemv_kernel<(WFormat)1, 2>".
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (const std::string drop : {"(anonymous namespace)::", "petrel::cuda::"})
    for (size_t p = s.find(drop); p != std::string::npos; p = s.find(drop)) s.erase(p, drop.size());
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {  // drop the parameter list: the first '(' outside <>
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) {
      s.resize(i);
      break;
    }
  }
  const size_t name_start = s.rfind("::", s.find('<'));
  return name_start == std::string::npos ? s : s.substr(name_start + 2);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records.push_back({short_name(k->name), k->start, k->end, k->gridX * k->gridY * k->gridZ,
                         k->blockX * k->blockY * k->blockZ, k->registersPerThread,
                         k->staticSharedMemory + k->dynamicSharedMemory});
  }
  std::free(buffer);
}

}  // namespace

bool KernelTrace::available() { return true; }

void KernelTrace::start() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
  }
  static std::once_flag registered;
  std::call_once(registered, [] {
    check_cupti(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
  });
  check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
}

std::vector<KernelRecord> KernelTrace::stop() {
  cudaDeviceSynchronize();
  check_cupti(cuptiActivityFlushAll(1), "flush");
  check_cupti(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable kernel records");
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<KernelRecord> out = std::move(g_records);
  g_records.clear();
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  return out;
}

#else

bool KernelTrace::available() { return false; }
void KernelTrace::start() { throw Error("kernel trace: this build has no CUPTI"); }
std::vector<KernelRecord> KernelTrace::stop() { return {}; }

#endif

}  // namespace petrel::cuda
