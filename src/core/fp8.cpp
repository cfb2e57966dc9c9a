#include "core/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace petrel {

size_t find_e4m3_nan(const uint8_t* codes, size_t n) {
  // Eight codes a step: (c & 0x7f) + 1 sets a byte's top bit only for 0x7f, and never carries
  // into the next byte, so whole-model scans at load cost about a memory pass.
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full, kOnes = 0x0101010101010101ull, kTops = 0x8080808080808080ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, codes + i, 8);
    if (((w & kLow7) + kOnes) & kTops) break;
  }
  for (; i < n; ++i)
    if (e4m3_is_nan(codes[i])) return i;
  return n;
}

uint8_t e4m3_from_f32(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  // Codes 0..126 are every finite non-negative value, increasing.
  const float* v = kE4m3Values.data();
  const int hi = int(std::lower_bound(v, v + 126, a) - v);
  if (hi == 0 || v[hi] <= a) return uint8_t(sign | hi);
  const int lo = hi - 1;
  const double below = double(a) - v[lo], above = double(v[hi]) - a;
  const int code = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return uint8_t(sign | code);
}

}  // namespace petrel
