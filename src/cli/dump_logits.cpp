// `petrel dump-logits DIR --prompt-ids 1,2,3 --out FILE.npy`: float32 [T, vocab] logits of every position.
#include <cstdio>

#include "cli/common.h"
#include "cli/registry.h"
#include "core/npy.h"

namespace petrel::cli {
namespace {

struct Args {
  std::string dir, ids, out;
  LoadOptions load;
};

void run(const Args& a) {
  const std::vector<int32_t> ids = parse_ids(a.ids, "--prompt-ids");
  LoadedModel m = load_model(a.dir, a.load);
  std::fprintf(stderr, "%s\n", m.summary().c_str());
  const int V = m.config().vocab;
  std::vector<float> logits(ids.size() * size_t(V));
  auto seq = m.model->new_sequence(int(ids.size()));
  m.model->forward(ids.data(), int(ids.size()), *seq, nullptr, logits.data());
  write_npy_f32(a.out, logits.data(), {int64_t(ids.size()), V});
  std::fprintf(stderr, "wrote %s: [%zu, %d] float32\n", a.out.c_str(), ids.size(), V);
}

void add(CLI::App& app) {
  static Args a;
  auto* cmd = app.add_subcommand("dump-logits", "Write the logits of every prompt position to a .npy file");
  add_model_dir(cmd, a.dir, "Checkpoint folder");
  cmd->add_option("--prompt-ids", a.ids, "Prompt token ids, comma separated")->required();
  cmd->add_option("--out", a.out, "Output .npy file (float32 [T, vocab])")->required();
  add_load_flags(cmd, a.load);
  cmd->callback([] { run(a); });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
