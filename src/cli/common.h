// Helpers shared by subcommands: model-loading flags and id-list parsing.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "runtime/loaded_model.h"

namespace petrel::cli {

// Adds --device, --threads, --chunk to `cmd`, bound to `opts`.
void add_load_flags(CLI::App* cmd, LoadOptions& opts);
// "1,2,3" or "1 2 3" -> ids; throws petrel::Error naming `flag` on bad input.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag);

}  // namespace petrel::cli
