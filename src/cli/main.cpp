// The `petrel` program: one subcommand per file in this folder, each registered via registry.h.
#include <cstdio>

#include "cli/registry.h"
#include "core/error.h"

namespace petrel::cli {
std::vector<CommandAdder>& command_adders() {
  static std::vector<CommandAdder> adders;
  return adders;
}
}  // namespace petrel::cli

int main(int argc, char** argv) {
  CLI::App app{"Petrel: fast inference for hybrid linear-attention MoE language models"};
  app.set_version_flag("--version", std::string("petrel ") + PETREL_VERSION);
  app.require_subcommand(1);
  for (auto& add : petrel::cli::command_adders()) add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const petrel::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
