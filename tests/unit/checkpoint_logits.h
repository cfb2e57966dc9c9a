// Every prompt position's logits of a checkpoint on the CPU backend (one thread), for the loader
// tests that compare two layouts of the same weights, and the fixtures' reference prompts.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"
#include "test_util.h"

namespace petrel::test {

inline std::vector<float> prompt_logits(const Checkpoint& ck, const std::vector<int32_t>& prompt) {
  CpuBackend backend{CpuOptions{1}};
  Model model(ck.config(), ck.weights(), backend, ForwardOptions{});
  auto seq = model.new_sequence(int(prompt.size()));
  std::vector<float> logits(prompt.size() * size_t(ck.config().vocab));
  model.forward(prompt.data(), int(prompt.size()), *seq, nullptr, logits.data());
  return logits;
}

// The prompt of a fixture model's reference.json.
inline std::vector<int32_t> reference_prompt(const std::string& fixture) {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(fixture_model(fixture) + "/reference.json"));
  return j["prompt_ids"].get<std::vector<int32_t>>();
}

// Every logit of `got` within `rel` times the largest |logit| of `want`, and none of either NaN or infinite.
inline void expect_logits_within(const std::vector<float>& want, const std::vector<float>& got, float rel) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(want[i]) && std::isfinite(got[i])) << "logit " << i << ": " << want[i] << " vs " << got[i];
    scale = std::max(scale, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(worst, rel * scale) << "largest logit difference " << worst << " of max |logit| " << scale;
}

}  // namespace petrel::test
