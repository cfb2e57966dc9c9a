#include "model/config.h"

namespace petrel {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Qwen3_5Moe: return "qwen3_5_moe";
    case Arch::Qwen3_5: return "qwen3_5";
    case Arch::Qwen3Next: return "qwen3_next";
    case Arch::Qwen3Moe: return "qwen3_moe";
    case Arch::Qwen3: return "qwen3";
  }
  return "?";
}

int ModelConfig::count(LayerKind k) const {
  int n = 0;
  for (LayerKind x : layer_kinds) n += (x == k);
  return n;
}

}  // namespace petrel
