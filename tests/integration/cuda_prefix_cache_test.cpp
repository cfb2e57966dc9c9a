// The prefix cache's host tier on the GPU: a snapshot spilled to pinned host memory restores into a
// device state exactly what it restores from the device, so the tokens fed after either restore
// give the same logits, bit for bit. Skipped, with a message, without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_fixture.h"
#include "runtime/prefix_cache.h"

namespace petrel {
namespace {

constexpr int kContext = 160;

std::vector<int32_t> tokens(int n, int seed, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (i * 29 + seed * 13 + 3) % vocab;
  return t;
}

// Restores `prompt` from `cache` into a fresh state (64 tokens, its snapshot) and feeds the rest:
// the logits of every fed token.
std::vector<float> restore_and_feed(test::CudaFixtureModel& m, PrefixCache& cache, const std::vector<int32_t>& prompt) {
  auto st = m.model->new_sequence(kContext);
  EXPECT_EQ(cache.restore(prompt, *st), 64);
  const int rest = int(prompt.size()) - st->n_past;
  std::vector<float> logits(size_t(rest) * size_t(m.vocab()));
  m.model->forward(prompt.data() + st->n_past, rest, *st, nullptr, logits.data());
  return logits;
}

TEST(CudaPrefixCache, ARestoreFromHostMemoryEqualsOneFromTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  test::CudaFixtureModel m("qwen35moe-vlm-fused");
  const std::vector<int32_t> a = tokens(100, 1, m.vocab()), b = tokens(100, 2, m.vocab());
  const auto new_state = [&](int n) { return m.model->new_sequence(n); };
  auto fed = m.model->new_sequence(kContext);
  m.model->forward(a.data(), 64, *fed, nullptr);
  PrefixCache probe({.block = 64, .interval = 128}, new_state);
  probe.offer(a, *fed);
  const size_t one = probe.stats().bytes;
  ASSERT_GT(one, 0u);
  PrefixCache cache({.budget_bytes = one + one / 2, .block = 64, .interval = 128, .host_budget_bytes = 4 * one},
                    new_state, [&](int n) { return m.model->new_host_sequence(n); });
  cache.offer(a, *fed);
  ASSERT_EQ(cache.stats().entries, 1);
  const std::vector<float> from_device = restore_and_feed(m, cache, a);

  fed->reset();
  m.model->forward(b.data(), 64, *fed, nullptr);
  cache.offer(b, *fed);  // the device budget holds one snapshot: a's moves to host memory
  const PrefixCacheStats s = cache.stats();
  ASSERT_EQ(s.spills, 1u);
  ASSERT_EQ(s.host_entries, 1);
  const std::vector<float> from_host = restore_and_feed(m, cache, a);
  EXPECT_EQ(cache.stats().host_hit_tokens, 64u);
  EXPECT_EQ(from_host, from_device);
}

}  // namespace
}  // namespace petrel
