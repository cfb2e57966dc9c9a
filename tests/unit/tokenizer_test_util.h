// Shared helpers for the tokenizer and chat-template tests: fixture paths and JSON patches.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "petrel/tokenizer.h"

namespace petrel::test {

inline std::filesystem::path tokenizer_fixtures() { return std::filesystem::path(PETREL_FIXTURES_DIR) / "tokenizer"; }

// The published Qwen3 tokenizer, fetched (not committed) by scripts/fetch-test-data.sh.
inline std::filesystem::path qwen3_dir() { return std::filesystem::path(PETREL_FIXTURES_DIR) / ".cache/qwen3-tokenizer"; }

inline const char* kFetchHint =
    "the Qwen3 tokenizer is missing from tests/fixtures/.cache/qwen3-tokenizer: run scripts/fetch-test-data.sh";

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline nlohmann::ordered_json read_json(const std::filesystem::path& path) {
  return nlohmann::ordered_json::parse(read_file(path));
}

inline bool qwen3_available() { return std::filesystem::exists(qwen3_dir() / "tokenizer.json"); }

// The Qwen3 tokenizer, loaded once for all tests.
inline const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load(qwen3_dir());
  return t;
}

// The same "set"/"append" patches tools/tokenizer/make_goldens.py applies to tokenizer.json.
inline nlohmann::json apply_patches(nlohmann::json doc, const nlohmann::ordered_json& patches) {
  for (const auto& patch : patches) {
    nlohmann::json* node = &doc;
    const auto& path = patch["path"];
    for (size_t i = 0; i + 1 < path.size(); ++i) node = &(*node)[path[i].get<std::string>()];
    nlohmann::json& target = (*node)[path.back().get<std::string>()];
    const nlohmann::json value = nlohmann::json::parse(patch["value"].dump());
    if (patch["op"] == "set") target = value;
    else target.push_back(value);
  }
  return doc;
}

}  // namespace petrel::test

// Fails the current test with instructions when the fetched tokenizer is absent.
#define PETREL_REQUIRE_QWEN3()                                   \
  do {                                                           \
    if (!::petrel::test::qwen3_available()) FAIL() << ::petrel::test::kFetchHint; \
  } while (0)
