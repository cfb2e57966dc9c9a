#include "cli/common.h"

#include "cli/number_flags.h"
#include "core/error.h"

namespace petrel::cli {

void add_model_dir(CLI::App* cmd, std::string& dir, const std::string& description, bool required) {
  CLI::Option_group* group = cmd->add_option_group("model", "The model: DIR or -m DIR");
  group->add_option("dir", dir, description);
  group->add_option("-m,--model", dir, description + " (the same as DIR)");
  if (required) group->require_option(1);
  else group->require_option(0, 1);
}

void add_threads_flag(CLI::App* cmd, int& threads) {
  cmd->add_option("-t,--threads", threads, "CPU threads (0 = all cores)")->capture_default_str()->check(integer_in(0));
}

void add_device_flags(CLI::App* cmd, LoadOptions& opts) {
  cmd->add_option("--device", opts.device, "Where to run: auto (cuda when a GPU is present), cuda or cpu")
      ->capture_default_str();
  cmd->add_option("--quantize", opts.quantize,
                  "none; int4 (CUDA) or fp8 (e4m3, 128x128 block scales, as Qwen's FP8 releases) to quantise "
                  "float weights at load")
      ->capture_default_str();
  add_threads_flag(cmd, opts.threads);
}

void add_load_flags(CLI::App* cmd, LoadOptions& opts) {
  add_device_flags(cmd, opts);
  cmd->add_option("--chunk", opts.max_chunk, "Prefill chunk length in tokens")->capture_default_str()
      ->check(integer_in(1));
}

int prefix_cache_host_default_mb(const std::string& device) { return resolve_device(device) == "cuda" ? 8192 : 0; }

std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(cur, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == cur.size() && v >= 0 && v <= INT32_MAX,
          flag + ": '" + cur + "' is not a token id (expected non-negative integers separated by commas)");
    ids.push_back(int32_t(v));
    cur.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == ' ' || ch == '\n' || ch == '\t') flush();
    else cur += ch;
  }
  flush();
  check(!ids.empty(), flag + ": no token ids given");
  return ids;
}

}  // namespace petrel::cli
