// make_decoder picks where sampling runs: on the CPU backend, whose logits are host memory, the
// HostDecoder with the CPU Sampler (tests/integration/cuda_sampler_test.cpp covers CUDA).
#include <gtest/gtest.h>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "generate/host_decoder.h"
#include "generate/make_decoder.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel {
namespace {

TEST(MakeDecoder, CpuBackendSamplesOnTheHost) {
  auto ck = Checkpoint::open(test::fixture_model("qwen35-dense"));
  CpuBackend backend;
  EXPECT_EQ(backend.make_sampler(ck->config().vocab), nullptr);
  Model model(ck->config(), ck->weights(), backend);
  const std::unique_ptr<Decoder> decoder = make_decoder(model);
  EXPECT_NE(dynamic_cast<HostDecoder*>(decoder.get()), nullptr);
}

}  // namespace
}  // namespace petrel
