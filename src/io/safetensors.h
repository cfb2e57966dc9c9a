// Memory-mapped safetensors files with a bounds-checked header parser.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/mapped_file.h"

namespace petrel {

// A tensor stored in a mapped file: metadata plus a pointer into the mapping.
struct TensorInfo {
  std::string name;
  std::string file;  // path of the file holding it, for error messages
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;  // "[8192, 1, 4]"
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and parses its header; throws petrel::Error naming the file on any defect.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole mapped file; every tensor's bytes lie inside it.
  std::span<const uint8_t> bytes() const { return map_.bytes(); }

 private:
  void parse_header();

  std::string path_;
  MappedFile map_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace petrel
