#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"

namespace petrel {
namespace {

using json = nlohmann::json;

// Bytes of `shape` elements of `dtype`; false when the product (or a partial one) overflows int64.
bool tensor_bytes(const std::vector<int64_t>& shape, DType dtype, uint64_t* bytes) {
  int64_t n = int64_t(dtype_size(dtype));
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return false;
  *bytes = uint64_t(n);
  return true;
}

std::vector<int64_t> parse_shape(const json& shape, const std::string& where) {
  check(shape.is_array(), where + ": shape must be an array of dims, found " + shape.dump());
  std::vector<int64_t> dims;
  for (const auto& d : shape) {
    check(d.is_number_integer() && d.get<int64_t>() >= 0,
          where + ": shape " + shape.dump() + " has a dim that is not a non-negative integer");
    dims.push_back(d.get<int64_t>());
  }
  return dims;
}

// One header entry {dtype, shape, data_offsets}, its bytes inside `data` (the data section).
TensorInfo parse_entry(const std::string& path, const std::string& name, const json& entry, const uint8_t* data,
                       size_t data_size) {
  const std::string where = path + ": tensor '" + name + "'";
  check(entry.is_object() && entry.contains("dtype") && entry.contains("shape") && entry.contains("data_offsets"),
        where + ": malformed header entry, expected {dtype, shape, data_offsets}");
  TensorInfo t;
  t.name = name;
  t.file = path;
  const json& dt = entry["dtype"];
  check(dt.is_string() && parse_safetensors_dtype(dt.get<std::string>(), &t.dtype),
        where + ": unsupported dtype " + dt.dump() + " (expected F32, F16, BF16, F8_E4M3, U32, I8, U8, I32 or I64)");
  t.shape = parse_shape(entry["shape"], where);
  const json& off = entry["data_offsets"];
  check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
        where + ": data_offsets must be two non-negative integers, found " + off.dump());
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  check(begin <= end && end <= data_size,
        where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
            ") out of bounds: the data section holds " + std::to_string(data_size) + " bytes (truncated file?)");
  uint64_t expected = 0;
  check(tensor_bytes(t.shape, t.dtype, &expected),
        where + ": shape " + t.shape_str() + " of " + dtype_name(t.dtype) + " is too large (its size overflows 64 bits)");
  check(end - begin == expected, where + ": " + std::to_string(end - begin) + " data bytes, but shape " +
                                     t.shape_str() + " of " + dtype_name(t.dtype) + " needs " +
                                     std::to_string(expected));
  t.data = data + begin;
  t.nbytes = end - begin;
  return t;
}

// Two tensors may not share bytes: a writer that produced that has mixed up its offsets.
void check_no_overlap(const std::string& path, const std::map<std::string, TensorInfo>& tensors) {
  std::vector<const TensorInfo*> by_start;
  for (const auto& [name, t] : tensors)
    if (t.nbytes > 0) by_start.push_back(&t);
  std::sort(by_start.begin(), by_start.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_start.size(); ++i) {
    const TensorInfo& a = *by_start[i - 1];
    const TensorInfo& b = *by_start[i];
    check(a.data + a.nbytes <= b.data, path + ": tensor '" + b.name + "' overlaps tensor '" + a.name +
                                           "' in the data section (data_offsets of one of them are wrong)");
  }
}

}  // namespace

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

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(path) { parse_header(); }

void SafetensorsFile::parse_header() {
  const uint8_t* map = map_.data();
  const size_t size = map_.size();
  check(size >= 8, path_ + ": truncated file: " + std::to_string(size) +
                       " bytes, a safetensors file needs at least 8 (header length)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, map, 8);  // little-endian u64
  check(header_len <= size - 8, path_ + ": malformed header: header length " + std::to_string(header_len) +
                                    " exceeds the file size " + std::to_string(size));
  const json header = parse_checkpoint_json(path_ + ": malformed header", map + 8, map + 8 + header_len);
  check(header.is_object(), path_ + ": malformed header: expected a JSON object, found " + header.type_name());
  const uint8_t* data = map + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (const auto& [k, v] : entry.items()) metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    tensors_.emplace(name, parse_entry(path_, name, entry, data, data_size));
  }
  check_no_overlap(path_, tensors_);
}

}  // namespace petrel
