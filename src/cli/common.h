// Helpers shared by subcommands: model-loading flags and id-list parsing.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "runtime/loaded_model.h"

namespace petrel::cli {

// The model folder as the positional DIR or as -m/--model DIR: exactly one of the two, or at most
// one when it is not `required` (a command with another source of weights).
void add_model_dir(CLI::App* cmd, std::string& dir, const std::string& description, bool required = true);
// -t/--threads N: CPU threads, 0 for all cores.
void add_threads_flag(CLI::App* cmd, int& threads);
// Adds --device, --quantize, -t/--threads to `cmd`, bound to `opts`.
void add_device_flags(CLI::App* cmd, LoadOptions& opts);
// The device flags and --chunk, the model's prefill chunk length.
void add_load_flags(CLI::App* cmd, LoadOptions& opts);
// --prefix-cache-host-mb when not given: 8192 where --device resolves to cuda (host memory is
// plentiful beside a GPU's), 0 on the CPU, whose snapshots are in host memory already.
int prefix_cache_host_default_mb(const std::string& device);
// "1,2,3" or "1 2 3" -> ids; throws petrel::Error naming `flag` on bad input.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag);

}  // namespace petrel::cli
