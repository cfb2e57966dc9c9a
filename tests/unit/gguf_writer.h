// A GGUF writer for tests: well-formed files, and broken ones through its raw fields.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "io/gguf.h"

namespace petrel::test {

class GgufWriter {
 public:
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  uint64_t alignment = 32;  // padding of the data section; the file says so only through general.alignment
  std::optional<uint64_t> tensor_count, kv_count;  // override the true counts

  // A key with a raw value (its type id and encoded bytes).
  void kv_raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
    put_string(kv_, key);
    put(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++n_kv_;
  }
  template <class T>
  void kv(const std::string& key, GgufType type, T v) {
    std::vector<uint8_t> b;
    put(b, v);
    kv_raw(key, uint32_t(type), b);
  }
  void kv_string(const std::string& key, const std::string& s) {
    std::vector<uint8_t> b;
    put_string(b, s);
    kv_raw(key, uint32_t(GgufType::String), b);
  }
  void kv_strings(const std::string& key, const std::vector<std::string>& items) {
    std::vector<uint8_t> b;
    put(b, uint32_t(GgufType::String));
    put(b, uint64_t(items.size()));
    for (const auto& s : items) put_string(b, s);
    kv_raw(key, uint32_t(GgufType::Array), b);
  }
  template <class T>
  void kv_array(const std::string& key, GgufType elem, const std::vector<T>& items) {
    std::vector<uint8_t> b;
    put(b, uint32_t(elem));
    put(b, uint64_t(items.size()));
    for (const T& v : items) put(b, v);
    kv_raw(key, uint32_t(GgufType::Array), b);
  }

  // A tensor whose bytes go at the next aligned data offset, or at `offset` when given.
  void tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& ne, const std::vector<uint8_t>& data,
              std::optional<uint64_t> offset = {}) {
    uint64_t off = offset ? *offset : next_offset_;
    tensors_.push_back({name, uint32_t(type), ne, data, off});
    next_offset_ = std::max(next_offset_, align(off + data.size()));
  }
  // A tensor of type id `type` (any number), with no data.
  void tensor_raw(const std::string& name, uint32_t type, const std::vector<uint64_t>& ne, uint64_t offset) {
    tensors_.push_back({name, type, ne, {}, offset});
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b;
    put(b, magic);
    put(b, version);
    put(b, tensor_count.value_or(tensors_.size()));
    put(b, kv_count.value_or(n_kv_));
    b.insert(b.end(), kv_.begin(), kv_.end());
    for (const auto& t : tensors_) {
      put_string(b, t.name);
      put(b, uint32_t(t.ne.size()));
      for (uint64_t d : t.ne) put(b, d);
      put(b, t.type);
      put(b, t.offset);
    }
    b.resize(align(b.size()), 0);
    const size_t data_start = b.size();
    for (const auto& t : tensors_) {
      if (t.data.empty()) continue;
      if (b.size() < data_start + t.offset + t.data.size()) b.resize(data_start + t.offset + t.data.size(), 0);
      std::memcpy(b.data() + data_start + t.offset, t.data.data(), t.data.size());
    }
    return b;
  }
  void write(const std::string& path) const {
    const std::vector<uint8_t> b = bytes();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }

  template <class T>
  static void put(std::vector<uint8_t>& b, T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
  }
  static void put_string(std::vector<uint8_t>& b, const std::string& s) {
    put(b, uint64_t(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
    uint64_t offset;
  };
  uint64_t align(uint64_t n) const { return (n + alignment - 1) / alignment * alignment; }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
  uint64_t next_offset_ = 0;
};

}  // namespace petrel::test
