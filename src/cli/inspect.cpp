// `petrel inspect DIR`: what a checkpoint holds, without running it.
#include <cstdio>

#include "cli/common.h"
#include "cli/registry.h"
#include "core/progress.h"
#include "io/checkpoint.h"

namespace petrel::cli {
namespace {

std::string layer_pattern(const ModelConfig& c) {
  std::string s;
  for (int i = 0; i < c.n_layers; ++i) s += c.layer_kinds[i] == LayerKind::DeltaNet ? 'L' : 'A';
  return s;
}

std::string count(int64_t n) {
  char buf[32];
  if (n >= 1000000000) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1000000) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

void run_inspect(const std::string& dir) {
  auto ck = Checkpoint::open(dir);
  const ModelConfig& c = ck->config();
  const CheckpointInfo& info = ck->info();
  std::printf("architecture     %s\n", arch_name(c.arch));
  std::printf("format           %s%s\n", info.format_name.c_str(),
              info.norms_preshifted ? " (norm weights stored with +1 folded in)" : "");
  std::printf("layers           %d  (L = gated deltanet, A = full attention)\n", c.n_layers);
  std::printf("layer pattern    %s\n", layer_pattern(c).c_str());
  std::printf("hidden           %d, vocab %d\n", c.hidden, c.vocab);
  std::printf("attention        %d q heads, %d kv heads, head dim %d, rotary %d, theta %g%s\n", c.n_heads,
              c.n_kv_heads, c.head_dim, c.rotary_dim, double(c.rope_theta), c.attn_output_gate ? ", output gate" : "");
  if (c.hybrid())
    std::printf("gated deltanet   %d k heads x %d, %d v heads x %d, conv %d\n", c.lin_k_heads, c.lin_k_dim,
                c.lin_v_heads, c.lin_v_dim, c.conv_kernel);
  if (c.n_experts)
    std::printf("moe              %d experts, top %d, width %d, shared %d%s\n", c.n_experts, c.top_k,
                c.moe_intermediate, c.shared_intermediate, c.norm_topk_prob ? ", renormalised" : "");
  if (c.intermediate) std::printf("dense mlp        width %d\n", c.intermediate);
  std::printf("parameters       %s total, %s active per token\n", count(info.parameters).c_str(),
              count(info.active_parameters).c_str());
  std::printf("weight bytes     %s\n", format_bytes(double(info.weight_bytes)).c_str());
  std::printf("skipped tensors  %zu%s\n", info.skipped.size(),
              info.skipped.empty() ? "" : (" (e.g. " + info.skipped.front() + ")").c_str());
}

void add(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Describe a checkpoint: architecture, format, layers, sizes");
  static std::string dir;
  add_model_dir(cmd, dir, "Checkpoint folder");
  cmd->callback([] { run_inspect(dir); });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
