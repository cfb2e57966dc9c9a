// Every prompt position's logits of a checkpoint on the CPU backend (one thread): the loader tests
// compare two layouts of the same weights with it.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel::test {

inline std::vector<float> prompt_logits(const Checkpoint& ck, const std::vector<int32_t>& prompt) {
  CpuBackend backend{CpuOptions{1}};
  Model model(ck.config(), ck.weights(), backend, ForwardOptions{});
  auto seq = model.new_sequence(int(prompt.size()));
  std::vector<float> logits(prompt.size() * size_t(ck.config().vocab));
  model.forward(prompt.data(), int(prompt.size()), *seq, nullptr, logits.data());
  return logits;
}

}  // namespace petrel::test
