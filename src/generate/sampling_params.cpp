#include "generate/sampling_params.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace petrel {
namespace {

std::string num(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void require(bool ok, const char* field, const char* expected, double found) {
  check(ok, std::string(field) + ": expected " + expected + ", found " + num(found));
}

}  // namespace

void SamplingParams::validate(int vocab) const {
  require(std::isfinite(temperature) && temperature >= 0.0f, "temperature", "a number >= 0", temperature);
  require(top_k >= 0, "top_k", "an integer >= 0 (0 = off)", top_k);
  require(top_p > 0.0f && top_p <= 1.0f, "top_p", "a number in (0, 1]", top_p);
  require(min_p >= 0.0f && min_p <= 1.0f, "min_p", "a number in [0, 1]", min_p);
  require(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f, "repetition_penalty", "a number > 0",
          repetition_penalty);
  require(std::isfinite(presence_penalty), "presence_penalty", "a finite number", presence_penalty);
  require(std::isfinite(frequency_penalty), "frequency_penalty", "a finite number", frequency_penalty);
  require(penalty_last_n >= 0, "penalty_last_n", "an integer >= 0 (0 = whole sequence)", penalty_last_n);
  for (const auto& [id, bias] : logit_bias) {
    check(id >= 0 && id < vocab, "logit_bias: token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                                     std::to_string(vocab - 1) + ")");
    check(!std::isnan(bias), "logit_bias: the bias of token " + std::to_string(id) + " is NaN");
  }
}

}  // namespace petrel
