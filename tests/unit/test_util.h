// Small helpers for tests: temporary folders, fixture paths, a safetensors writer.
#pragma once
#include <sys/wait.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace petrel::test {

inline std::string fixture_model(const std::string& name) {
  return std::string(PETREL_FIXTURES_DIR) + "/models/" + name;
}

// models/petrel-tiny, the small trained model shipped with the repository.
inline std::string tiny_model_dir() {
  return (std::filesystem::path(PETREL_FIXTURES_DIR) / ".." / ".." / "models" / "petrel-tiny").lexically_normal().string();
}

// Every checkpoint layout in tests/fixtures/models.
inline const std::vector<std::string> kFixtureModels = {
    "qwen35moe-vlm-fused", "qwen35moe-text-per-expert", "qwen35-dense",       "qwen3next-sharded",
    "qwen3moe",            "qwen3-dense-f32",           "mlx-qwen35moe-4bit", "mlx-qwen3next-8bit",
    "qwen35moe-vlm-fp8",   "qwen3moe-gptq4",            "qwen3moe-gptq8v2",   "qwen3moe-awq4",
    "qwen35moe-gptq4sym",  "qwen3moe-sparse",           "qwen3-dense"};

// A fixture name as a gtest parameter name: "qwen3-dense-f32" -> "qwen3_dense_f32".
inline std::string param_name(std::string name) {
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

// A fresh folder under the system temp dir, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("petrel-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string str(const std::string& child = "") const { return (path / child).string(); }
};

struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  const uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, t] : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}

// All tensors of a safetensors file, copied out, for tests that rewrite checkpoints.
inline std::map<std::string, RawTensor> read_all(const std::string& path) {
  SafetensorsFile f(path);
  std::map<std::string, RawTensor> out;
  for (const auto& [name, t] : f.tensors())
    out[name] = RawTensor{dtype_name(t.dtype), t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
  return out;
}

// Cosine similarity of each of `rows` rows of length n in a and b (row-major).
inline std::vector<double> row_cosines(const std::vector<float>& a, const std::vector<float>& b, int rows, int n) {
  std::vector<double> out;
  for (int t = 0; t < rows; ++t) {
    double dot = 0, na = 0, nb = 0;
    for (int v = 0; v < n; ++v) {
      const double x = a[size_t(t) * n + v], y = b[size_t(t) * n + v];
      dot += x * y;
      na += x * x;
      nb += y * y;
    }
    out.push_back(dot / std::sqrt(na * nb));
  }
  return out;
}

// The petrel program run with `args` through the shell: its exit status and what `streams` sends
// to the pipe ("2>&1": stdout then stderr; "2>/dev/null": stdout alone).
struct CliResult {
  int status;
  std::string out;
};
inline CliResult run_petrel(const std::string& args, const std::string& streams = "2>&1") {
  const std::string cmd = std::string(PETREL_BINARY_DIR) + "/src/petrel " + args + " " + streams;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace petrel::test
