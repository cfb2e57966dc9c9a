// `petrel dump-logits DIR --prompt-ids 1,2,3 --out FILE.npy`: float32 [T, vocab] logits of every position;
// optionally the hidden states before the final norm and the MTP head's logits, for reference tools.
#include <cstdio>

#include "cli/common.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/npy.h"

namespace petrel::cli {
namespace {

struct Args {
  std::string dir, ids, out, hidden_out, mtp_out;
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
  const int T = int(ids.size()), H = m.config().hidden;
  check((a.hidden_out.empty() && a.mtp_out.empty()) || T <= m.model->max_batch(),
        "--hidden-out / --mtp-out: the hidden states of one prefill chunk are kept; " + std::to_string(T) +
            " prompt ids exceed --chunk " + std::to_string(m.model->max_batch()));
  if (!a.hidden_out.empty()) {
    std::vector<float> hidden(size_t(T) * H);
    m.model->backend().to_host(m.model->last_hidden(), hidden.data());
    write_npy_f32(a.hidden_out, hidden.data(), {T, H});
    std::fprintf(stderr, "wrote %s: [%d, %d] float32\n", a.hidden_out.c_str(), T, H);
  }
  if (!a.mtp_out.empty()) {
    check(T >= 2, "--mtp-out: the head pairs each position with the next token; needs at least 2 prompt ids");
    auto mtp = m.model->new_mtp_sequence(T);
    std::vector<float> mtp_logits(size_t(T - 1) * V);
    m.model->mtp_forward(ids.data() + 1, T - 1, /*from_trunk=*/true, *mtp, mtp_logits.data());
    write_npy_f32(a.mtp_out, mtp_logits.data(), {T - 1, V});
    std::fprintf(stderr, "wrote %s: [%d, %d] float32\n", a.mtp_out.c_str(), T - 1, V);
  }
}

void add(CLI::App& app) {
  static Args a;
  auto* cmd = app.add_subcommand("dump-logits", "Write the logits of every prompt position to a .npy file");
  add_model_dir(cmd, a.dir, "Checkpoint folder");
  cmd->add_option("--prompt-ids", a.ids, "Prompt token ids, comma separated")->required();
  cmd->add_option("--out", a.out, "Output .npy file (float32 [T, vocab])")->required();
  cmd->add_option("--hidden-out", a.hidden_out, "Also write the hidden states before the final norm (float32 [T, H])");
  cmd->add_option("--mtp-out", a.mtp_out,
                  "Also write the MTP head's logits, row t from position t and token t+1 (float32 [T-1, vocab])");
  add_load_flags(cmd, a.load);
  cmd->callback([] { run(a); });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
