// A whole file mapped read-only into memory; weights are views into it, never copies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace petrel {

class MappedFile {
 public:
  // Maps `path`; throws petrel::Error naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return map_; }  // null for an empty file
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {map_, size_}; }

 private:
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace petrel
