// Each subcommand file registers itself here, so adding a command touches one file only.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace petrel::cli {

using CommandAdder = std::function<void(CLI::App& app)>;

std::vector<CommandAdder>& command_adders();

// Use at namespace scope in a subcommand file: `static CommandRegistrar reg(add_my_command);`
struct CommandRegistrar {
  explicit CommandRegistrar(CommandAdder adder) { command_adders().push_back(std::move(adder)); }
};

}  // namespace petrel::cli
