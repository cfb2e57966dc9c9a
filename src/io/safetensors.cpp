#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace petrel {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    check(m != MAP_FAILED, path + ": mmap failed (" + std::strerror(errno) + ")");
    map_ = static_cast<const uint8_t*>(m);
  } else {
    ::close(fd);
  }
  try {
    parse_header();
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

void SafetensorsFile::parse_header() {
  check(size_ >= 8, path_ + ": truncated file: " + std::to_string(size_) +
                        " bytes, a safetensors file needs at least 8 (header length)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, map_, 8);  // little-endian u64
  check(header_len <= size_ - 8, path_ + ": malformed header: header length " + std::to_string(header_len) +
                                     " exceeds the file size " + std::to_string(size_));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(map_ + 8, map_ + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path_ + ": malformed header: not valid JSON (" + e.what() + ")");
  }
  check(header.is_object(), path_ + ": malformed header: expected a JSON object");
  const size_t data_start = 8 + header_len;
  const size_t data_size = size_ - data_start;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (auto& [k, v] : entry.items()) metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const std::string where = path_ + ": tensor '" + name + "'";
    check(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
              entry.contains("data_offsets"),
          where + ": malformed header entry, expected {dtype, shape, data_offsets}");
    TensorInfo t;
    t.name = name;
    t.file = path_;
    const auto& dt = entry["dtype"];
    check(dt.is_string() && parse_safetensors_dtype(dt.get<std::string>(), &t.dtype),
          where + ": unsupported dtype " + dt.dump() + " (expected F32, F16, BF16, U32, I8, U8, I32 or I64)");
    const auto& shape = entry["shape"];
    check(shape.is_array(), where + ": shape must be an array");
    for (const auto& d : shape) {
      check(d.is_number_integer() && d.get<int64_t>() >= 0, where + ": shape has a non-integer or negative dim");
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = entry["data_offsets"];
    check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
          where + ": data_offsets must be two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    check(begin <= end && end <= data_size,
          where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
              ") out of bounds: the data section holds " + std::to_string(data_size) +
              " bytes (truncated file?)");
    const uint64_t expected = uint64_t(t.numel()) * dtype_size(t.dtype);
    check(end - begin == expected, where + ": " + std::to_string(end - begin) + " data bytes, but shape " +
                                       t.shape_str() + " of " + dtype_name(t.dtype) + " needs " +
                                       std::to_string(expected));
    t.data = map_ + data_start + begin;
    t.nbytes = end - begin;
    tensors_.emplace(name, std::move(t));
  }
}

}  // namespace petrel
