// Counter-based random numbers: the draw for a token is a pure function of (seed, position).
// A run is reproducible, speculative verification consumes exactly the randomness plain decoding
// would, and a GPU kernel can compute the same number without carrying RNG state.
#pragma once
#include <cstdint>

namespace petrel {

// SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix with full avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) for the token at sequence position `position` under `seed`.
constexpr double uniform01(uint64_t seed, uint64_t position) {
  const uint64_t bits = mix64(mix64(seed) ^ (position * 0xD1B54A32D192ED03ull));
  return double(bits >> 11) * 0x1.0p-53;
}

}  // namespace petrel
