// What the fuzz targets share: a scratch folder for the files a loader reads, input splitting,
// and how a broken invariant is reported.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace petrel::fuzz {

// A folder of this process's own, reused by every input and removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string name = (std::filesystem::temp_directory_path() / "petrel-fuzz-XXXXXX").string();
    if (!::mkdtemp(name.data())) std::abort();
    path_ = name;
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }

  const std::filesystem::path& path() const { return path_; }
  // Removes what the previous input left.
  void clear() const {
    for (const auto& entry : std::filesystem::directory_iterator(path_)) std::filesystem::remove_all(entry.path());
  }
  void write(const std::string& name, std::string_view bytes) const {
    std::ofstream out(path_ / name, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }

 private:
  std::filesystem::path path_;
};

// `data` cut at every occurrence of `separator`.
inline std::vector<std::string_view> split(std::string_view data, std::string_view separator) {
  std::vector<std::string_view> parts;
  for (size_t at = data.find(separator); at != std::string_view::npos; at = data.find(separator)) {
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + separator.size());
  }
  parts.push_back(data);
  return parts;
}

// A broken invariant is a crash to libFuzzer, which then saves the input.
inline void require(bool condition, const std::string& what) {
  if (condition) return;
  std::fprintf(stderr, "invariant broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace petrel::fuzz
