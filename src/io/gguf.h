// GGUF files (llama.cpp's model format, versions 2 and 3, little-endian) read over a read-only
// mapping with every bound checked: the header, the metadata key/values, the tensor infos and
// the data section. A model split by gguf-split or the converter into NAME-00001-of-0000N.gguf,
// ..., NAME-0000N-of-0000N.gguf opens as one tensor set (GgufModel).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/gguf_quants.h"
#include "io/mapped_file.h"

namespace petrel {

// Metadata value types (gguf.h `enum gguf_type`).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);  // "UINT32", "STRING", ... as gguf-py spells them

// One metadata value: a scalar, or an array whose elements share one scalar type (GGUF allows
// arrays of arrays; no model key uses them and ggml refuses them, so Petrel does too).
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem = GgufType::U8;      // Array: the elements' type
  std::vector<uint64_t> ints;        // integers and bools; signed ones as two's complement
  std::vector<double> floats;        // FLOAT32 and FLOAT64
  std::vector<std::string> strings;  // STRING

  bool is_array() const { return type == GgufType::Array; }
  GgufType scalar_type() const { return is_array() ? elem : type; }
  size_t size() const;           // elements; 1 for a scalar
  std::string type_str() const;  // "UINT32", "ARRAY of STRING"
};

// A file's key/values with typed getters. The getters throw petrel::Error naming the file and
// the key when the key is missing or holds another type: integer getters take any integer type
// whose value fits, get_float takes FLOAT32, FLOAT64 and integers.
class GgufMetadata {
 public:
  explicit GgufMetadata(std::string file = "") : file_(std::move(file)) {}
  const std::string& file() const { return file_; }
  const std::map<std::string, GgufValue>& values() const { return values_; }
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Adds a key; false when the key is there already.
  bool insert(const std::string& key, GgufValue value) { return values_.emplace(key, std::move(value)).second; }

  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_strings(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key) const;
  std::vector<double> get_floats(const std::string& key) const;

 private:
  const GgufValue& value(const std::string& key, const char* expected) const;
  std::string where(const std::string& key) const;

  std::string file_;
  std::map<std::string, GgufValue> values_;
};

// A tensor in a mapped GGUF file. Dims are in ggml order: ne[0] is the innermost dim, the length
// of a row (PyTorch's last dim), so a PyTorch [out, in] weight is {in, out}.
struct GgufTensor {
  std::string name;
  std::string file;  // path of the file holding it, for messages
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;
  uint64_t offset = 0;  // in the file's data section
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  int64_t row_length() const { return ne.empty() ? 1 : ne[0]; }
  int64_t rows() const;           // numel / row_length (0 for an empty tensor)
  std::string shape_str() const;  // "{2048, 512}", ggml order as llama.cpp prints it
};

class GgufFile {
 public:
  // Maps `path` and parses its header; throws petrel::Error naming the file on any defect.
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const GgufMetadata& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // in file order
  size_t data_offset() const { return data_offset_; }  // where the data section starts
  std::span<const uint8_t> bytes() const { return map_.bytes(); }

 private:
  void parse();

  std::string path_;
  MappedFile map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  GgufMetadata metadata_;
  std::vector<GgufTensor> tensors_;
  size_t data_offset_ = 0;
};

// A model as one GGUF file or as every shard of a split. Metadata comes from the first shard
// (split.no 0), which holds all of it; the tensors are those of all shards.
class GgufModel {
 public:
  // Opens `path`: a .gguf file, or any shard of NAME-0000i-of-0000N.gguf (all N are opened);
  // throws petrel::Error naming the file on any defect or missing shard.
  explicit GgufModel(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::unique_ptr<GgufFile>>& files() const { return files_; }
  const GgufMetadata& metadata() const { return files_.front()->metadata(); }
  const std::map<std::string, const GgufTensor*>& tensors() const { return tensors_; }
  const GgufTensor* find(const std::string& name) const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<GgufFile>> files_;
  std::map<std::string, const GgufTensor*> tensors_;
};

// Whether `path` is a regular file whose name ends in .gguf.
bool is_gguf_file(const std::string& path);

// The parts of a split file name NAME-0000i-of-0000N.gguf; false for any other name.
bool parse_gguf_split_name(const std::string& path, std::string* prefix, int* index, int* count);
// NAME-0000i-of-0000N.gguf for `prefix` NAME (the format llama.cpp's llama_split_path writes).
std::string gguf_split_name(const std::string& prefix, int index, int count);

}  // namespace petrel
