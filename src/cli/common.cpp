#include "cli/common.h"

#include "core/error.h"

namespace petrel::cli {

void add_load_flags(CLI::App* cmd, LoadOptions& opts) {
  cmd->add_option("--device", opts.device, "Where to run: auto (cuda when a GPU is present), cuda or cpu")
      ->capture_default_str();
  cmd->add_option("--quantize", opts.quantize, "CUDA: none, or int4 to quantise bf16 weights at load")
      ->capture_default_str();
  cmd->add_option("--threads", opts.threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--chunk", opts.max_chunk, "Prefill chunk length in tokens")->capture_default_str()
      ->check(CLI::PositiveNumber);
}

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
