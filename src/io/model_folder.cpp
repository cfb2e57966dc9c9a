#include "io/model_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"

namespace fs = std::filesystem;

namespace petrel {
namespace {

constexpr size_t kListedEntries = 6;

bool hub_name(const std::string& s) {
  if (s.empty() || !std::isalnum(static_cast<unsigned char>(s[0])) || s.find("..") != std::string::npos) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// "owner/name" in the characters the Hub allows, whose owner is no folder here: "models/x", with
// models/ present, is a local path with a typo, not a model id.
bool looks_like_hub_id(const std::string& path) {
  const size_t slash = path.find('/');
  if (slash == std::string::npos || !hub_name(path.substr(0, slash)) || !hub_name(path.substr(slash + 1))) return false;
  std::error_code ec;
  return !fs::exists(path.substr(0, slash), ec);
}

// "a, b/, c (and 4 more)": the folder's entries in name order, folders marked with a slash.
std::string some_entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string() + (it->is_directory(ec) ? "/" : ""));
  std::sort(names.begin(), names.end());
  std::string list;
  for (size_t i = 0; i < std::min(names.size(), kListedEntries); ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > kListedEntries) list += " (and " + std::to_string(names.size() - kListedEntries) + " more)";
  return list;
}

}  // namespace

void check_model_folder(const std::string& dir, const std::string& needed, const std::string& expected) {
  const fs::path path(dir);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    if (looks_like_hub_id(dir)) {
      const std::string local = "models/" + dir.substr(dir.find('/') + 1);
      throw Error(dir + " is not a local folder; it looks like a Hugging Face model id, and petrel reads local "
                        "folders only: download it with `hf download " + dir + " --local-dir " + local +
                  "` and pass " + local);
    }
    throw Error(dir + ": no such folder (expected " + expected + ")");
  }
  if (!fs::is_directory(status)) {
    const fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    const bool in_model = path.filename() == needed || path.extension() == ".safetensors";
    throw Error(dir + " is a file; expected " + expected +
                (in_model ? " (the folder it is in: " + parent.string() + ")" : ""));
  }
  if (fs::exists(path / needed, ec)) return;
  const std::string entries = some_entries(path);
  throw Error(dir + " has no " + needed + " (expected " + expected + "); " +
              (entries.empty() ? "it is empty" : "it holds " + entries));
}

void check_checkpoint_folder(const std::string& dir) {
  if (is_gguf_file(dir)) return;  // a GGUF checkpoint is one file (or the shards named after it)
  std::error_code ec;
  check(fs::path(dir).extension() != ".gguf" || fs::exists(dir, ec), dir + ": no such file (expected a GGUF file)");
  check_model_folder(dir, "config.json", "a checkpoint folder containing config.json and *.safetensors");
}

}  // namespace petrel
