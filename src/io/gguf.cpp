#include "io/gguf.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "core/error.h"

namespace petrel {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Bytes of one element of a scalar type; 0 for STRING and ARRAY, whose size is in the file.
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::String: case GgufType::Array: return 0;
  }
  return 0;
}

bool known_type(uint32_t t) { return t <= uint32_t(GgufType::F64); }

bool is_signed(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}
bool is_integer(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64 || is_signed(t);
}

// Reads the header front to back; every read checks that the file holds the bytes it needs.
// `context` names what is being read ("metadata key 'general.name'") for the messages.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* data, size_t size) : path_(path), data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }
  void set_context(std::string context) { context_ = std::move(context); }
  const std::string& context() const { return context_; }

  void need(uint64_t n, const char* what) const {
    check(n <= left(), path_ + ": truncated file: " + what + " of " + context_ + " at byte " + std::to_string(pos_) +
                           " needs " + std::to_string(n) + " bytes, but the file ends at byte " +
                           std::to_string(size_));
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t len = get<uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string context_ = "the file header";
};

// Appends one element of scalar type `t` to `v`.
void read_scalar(Reader& r, GgufType t, GgufValue& v) {
  switch (t) {
    case GgufType::U8: v.ints.push_back(r.get<uint8_t>("a UINT8")); return;
    case GgufType::I8: v.ints.push_back(uint64_t(int64_t(r.get<int8_t>("an INT8")))); return;
    case GgufType::U16: v.ints.push_back(r.get<uint16_t>("a UINT16")); return;
    case GgufType::I16: v.ints.push_back(uint64_t(int64_t(r.get<int16_t>("an INT16")))); return;
    case GgufType::U32: v.ints.push_back(r.get<uint32_t>("a UINT32")); return;
    case GgufType::I32: v.ints.push_back(uint64_t(int64_t(r.get<int32_t>("an INT32")))); return;
    case GgufType::U64: v.ints.push_back(r.get<uint64_t>("a UINT64")); return;
    case GgufType::I64: v.ints.push_back(r.get<uint64_t>("an INT64")); return;
    case GgufType::Bool: v.ints.push_back(r.get<uint8_t>("a BOOL") != 0); return;
    case GgufType::F32: v.floats.push_back(r.get<float>("a FLOAT32")); return;
    case GgufType::F64: v.floats.push_back(r.get<double>("a FLOAT64")); return;
    case GgufType::String: v.strings.push_back(r.string("a STRING")); return;
    case GgufType::Array: return;  // excluded by the caller
  }
}

GgufValue read_value(Reader& r, const std::string& path) {
  GgufValue v;
  const uint32_t type = r.get<uint32_t>("the value type");
  check(known_type(type), path + ": " + r.context() + " has value type " + std::to_string(type) +
                              ", which is no GGUF type (expected 0 to 12)");
  v.type = GgufType(type);
  if (v.type != GgufType::Array) {
    read_scalar(r, v.type, v);
    return v;
  }
  const uint32_t elem = r.get<uint32_t>("the array element type");
  check(known_type(elem), path + ": " + r.context() + " is an array of type " + std::to_string(elem) +
                              ", which is no GGUF type (expected 0 to 12)");
  v.elem = GgufType(elem);
  check(v.elem != GgufType::Array, path + ": " + r.context() +
                                       " is an array of arrays, which Petrel does not read (nor does ggml)");
  const uint64_t n = r.get<uint64_t>("the array length");
  // Each element takes at least its fixed size (a string its 8-byte length): a count the rest
  // of the file cannot hold is a corrupt file, refused before anything is allocated for it.
  const size_t min_size = v.elem == GgufType::String ? 8 : scalar_size(v.elem);
  check(n <= r.left() / min_size, path + ": truncated file: " + r.context() + " is an array of " +
                                      std::to_string(n) + " " + gguf_type_name(v.elem) + " values, but only " +
                                      std::to_string(r.left()) + " bytes of the file are left");
  if (v.elem == GgufType::String) v.strings.reserve(size_t(n));
  else if (v.elem == GgufType::F32 || v.elem == GgufType::F64) v.floats.reserve(size_t(n));
  else v.ints.reserve(size_t(n));
  for (uint64_t i = 0; i < n; ++i) read_scalar(r, v.elem, v);
  return v;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "UINT8";
    case GgufType::I8: return "INT8";
    case GgufType::U16: return "UINT16";
    case GgufType::I16: return "INT16";
    case GgufType::U32: return "UINT32";
    case GgufType::I32: return "INT32";
    case GgufType::F32: return "FLOAT32";
    case GgufType::Bool: return "BOOL";
    case GgufType::String: return "STRING";
    case GgufType::Array: return "ARRAY";
    case GgufType::U64: return "UINT64";
    case GgufType::I64: return "INT64";
    case GgufType::F64: return "FLOAT64";
  }
  return "?";
}

// ------------------------------------------------------------------------------------ GgufValue

size_t GgufValue::size() const { return ints.size() + floats.size() + strings.size(); }

std::string GgufValue::type_str() const {
  return is_array() ? std::string("ARRAY of ") + gguf_type_name(elem) : gguf_type_name(type);
}

// --------------------------------------------------------------------------------- GgufMetadata

const GgufValue* GgufMetadata::find(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

std::string GgufMetadata::where(const std::string& key) const { return file_ + ": metadata key '" + key + "'"; }

const GgufValue& GgufMetadata::value(const std::string& key, const char* expected) const {
  const GgufValue* v = find(key);
  check(v != nullptr, file_ + ": missing metadata key '" + key + "' (expected " + expected + ")");
  return *v;
}

namespace {

// Element i of integer value v as int64; false when it does not fit.
bool int_at(const GgufValue& v, size_t i, int64_t* out) {
  const uint64_t bits = v.ints[i];
  if (is_signed(v.scalar_type())) {
    *out = int64_t(bits);
    return true;
  }
  if (bits > uint64_t(std::numeric_limits<int64_t>::max())) return false;
  *out = int64_t(bits);
  return true;
}

}  // namespace

std::string GgufMetadata::get_string(const std::string& key) const {
  const GgufValue& v = value(key, "a STRING");
  check(v.type == GgufType::String, where(key) + " is " + v.type_str() + ", expected a STRING");
  return v.strings[0];
}

uint64_t GgufMetadata::get_uint(const std::string& key) const {
  const GgufValue& v = value(key, "an unsigned integer");
  check(!v.is_array() && is_integer(v.type), where(key) + " is " + v.type_str() + ", expected an unsigned integer");
  check(!is_signed(v.type) || int64_t(v.ints[0]) >= 0,
        where(key) + " is " + std::to_string(int64_t(v.ints[0])) + ", expected a non-negative integer");
  return v.ints[0];
}

int64_t GgufMetadata::get_int(const std::string& key) const {
  const GgufValue& v = value(key, "an integer");
  check(!v.is_array() && is_integer(v.type), where(key) + " is " + v.type_str() + ", expected an integer");
  int64_t out = 0;
  check(int_at(v, 0, &out), where(key) + " is " + std::to_string(v.ints[0]) + ", too large for a 64-bit integer");
  return out;
}

double GgufMetadata::get_float(const std::string& key) const {
  const GgufValue& v = value(key, "a number");
  check(!v.is_array() && (is_integer(v.type) || v.type == GgufType::F32 || v.type == GgufType::F64),
        where(key) + " is " + v.type_str() + ", expected a number");
  if (!v.floats.empty()) return v.floats[0];
  return is_signed(v.type) ? double(int64_t(v.ints[0])) : double(v.ints[0]);
}

bool GgufMetadata::get_bool(const std::string& key) const {
  const GgufValue& v = value(key, "a BOOL");
  check(v.type == GgufType::Bool, where(key) + " is " + v.type_str() + ", expected a BOOL");
  return v.ints[0] != 0;
}

std::vector<std::string> GgufMetadata::get_strings(const std::string& key) const {
  const GgufValue& v = value(key, "an ARRAY of STRING");
  check(v.is_array() && v.elem == GgufType::String, where(key) + " is " + v.type_str() + ", expected an ARRAY of STRING");
  return v.strings;
}

std::vector<int64_t> GgufMetadata::get_ints(const std::string& key) const {
  const GgufValue& v = value(key, "an ARRAY of integers");
  check(v.is_array() && is_integer(v.elem), where(key) + " is " + v.type_str() + ", expected an ARRAY of integers");
  std::vector<int64_t> out(v.ints.size());
  for (size_t i = 0; i < out.size(); ++i)
    check(int_at(v, i, &out[i]), where(key) + ": element " + std::to_string(i) + " is " + std::to_string(v.ints[i]) +
                                     ", too large for a 64-bit integer");
  return out;
}

std::vector<double> GgufMetadata::get_floats(const std::string& key) const {
  const GgufValue& v = value(key, "an ARRAY of FLOAT32");
  check(v.is_array() && (v.elem == GgufType::F32 || v.elem == GgufType::F64),
        where(key) + " is " + v.type_str() + ", expected an ARRAY of FLOAT32");
  return v.floats;
}

// ----------------------------------------------------------------------------------- GgufTensor

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

int64_t GgufTensor::rows() const { return row_length() == 0 ? 0 : numel() / row_length(); }

std::string GgufTensor::shape_str() const {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

// ------------------------------------------------------------------------------------- GgufFile

GgufFile::GgufFile(const std::string& path) : path_(path), map_(path), metadata_(path) { parse(); }

void GgufFile::parse() {
  Reader r(path_, map_.data(), map_.size());
  check(map_.size() >= 4, path_ + ": not a GGUF file: " + std::to_string(map_.size()) +
                              " bytes, too short for the magic 'GGUF'");
  const uint32_t magic = r.get<uint32_t>("the magic");
  check(magic == kMagic, path_ + ": not a GGUF file: it starts with " + hex32(magic) +
                             " (as a little-endian u32), expected the magic 'GGUF' (0x46554747)");
  version_ = r.get<uint32_t>("the version");
  check((version_ & 0xffffu) != 0, path_ + ": a big-endian GGUF file (version field " + hex32(version_) +
                                       "); Petrel reads little-endian GGUF files only");
  check(version_ == 2 || version_ == 3, path_ + ": GGUF version " + std::to_string(version_) +
                                            " is not supported (expected 2 or 3)");
  const uint64_t n_tensors = r.get<uint64_t>("the tensor count");
  const uint64_t n_kv = r.get<uint64_t>("the metadata key/value count");

  // A key/value takes at least 13 bytes (key length, value type, a 1-byte value), a tensor info
  // 24 (name length, dim count, type, offset): counts past what the file holds are corrupt.
  check(n_kv <= r.left() / 13, path_ + ": truncated file: the header announces " + std::to_string(n_kv) +
                                   " metadata key/values, but only " + std::to_string(r.left()) +
                                   " bytes of the file are left");
  for (uint64_t i = 0; i < n_kv; ++i) {
    r.set_context("metadata key/value " + std::to_string(i) + " of " + std::to_string(n_kv));
    std::string key = r.string("the key");
    r.set_context("metadata key '" + key + "'");
    GgufValue v = read_value(r, path_);
    check(metadata_.insert(key, std::move(v)), path_ + ": metadata key '" + key + "' appears twice");
  }
  if (const GgufValue* a = metadata_.find("general.alignment")) {
    check(a->type == GgufType::U32, path_ + ": metadata key 'general.alignment' is " + a->type_str() +
                                        ", expected a UINT32");
    alignment_ = a->ints[0];
    check(alignment_ != 0 && (alignment_ & (alignment_ - 1)) == 0,
          path_ + ": metadata key 'general.alignment' is " + std::to_string(alignment_) +
              ", expected a power of two");
  } else {
    alignment_ = kDefaultAlignment;
  }

  check(n_tensors <= r.left() / 24, path_ + ": truncated file: the header announces " + std::to_string(n_tensors) +
                                        " tensors, but only " + std::to_string(r.left()) +
                                        " bytes of the file are left");
  tensors_.reserve(size_t(n_tensors));
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    r.set_context("tensor info " + std::to_string(i) + " of " + std::to_string(n_tensors));
    GgufTensor t;
    t.name = r.string("the tensor name");
    t.file = path_;
    r.set_context("tensor '" + t.name + "'");
    const std::string where = path_ + ": tensor '" + t.name + "'";
    check(names.insert(t.name).second, where + " appears twice");
    const uint32_t n_dims = r.get<uint32_t>("the dim count");
    check(n_dims <= kMaxDims, where + " has " + std::to_string(n_dims) + " dims, expected at most " +
                                  std::to_string(kMaxDims));
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = r.get<uint64_t>("a dim");
      check(n <= uint64_t(std::numeric_limits<int64_t>::max()) && !__builtin_mul_overflow(numel, int64_t(n), &numel),
            where + ": dim " + std::to_string(d) + " (" + std::to_string(n) +
                ") makes the element count overflow 64 bits");
      t.ne.push_back(int64_t(n));
    }
    const uint32_t type = r.get<uint32_t>("the type");
    const GgmlTypeInfo* info = ggml_type_by_id(type);
    check(info != nullptr, where + " has ggml type id " + std::to_string(type) +
                               ", which is no ggml type Petrel knows (a retired id, or a file newer than Petrel)");
    t.type = info->type;
    t.offset = r.get<uint64_t>("the data offset");
    check(t.row_length() % info->block == 0,
          where + " of type " + info->name + " has rows of " + std::to_string(t.row_length()) +
              " elements, which is not a multiple of the type's block of " + std::to_string(info->block));
    uint64_t nbytes = 0;
    check(!__builtin_mul_overflow(uint64_t(numel / info->block), uint64_t(info->bytes), &nbytes),
          where + " " + t.shape_str() + " of " + info->name + " is too large (its size overflows 64 bits)");
    t.nbytes = size_t(nbytes);
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  r.set_context("the file header");
  const size_t header_end = r.pos();
  data_offset_ = header_end + size_t((alignment_ - header_end % alignment_) % alignment_);
  const size_t size = map_.size();
  for (GgufTensor& t : tensors_) {
    const std::string where = path_ + ": tensor '" + t.name + "'";
    check(t.offset % alignment_ == 0, where + " has data offset " + std::to_string(t.offset) +
                                          ", not a multiple of the alignment " + std::to_string(alignment_));
    const bool fits = data_offset_ <= size && t.offset <= size - data_offset_ &&
                      t.nbytes <= size - data_offset_ - t.offset;
    check(fits, where + " " + t.shape_str() + " of " + ggml_type_name(t.type) + " (" + std::to_string(t.nbytes) +
                    " bytes at data offset " + std::to_string(t.offset) + ") ends past the end of the file: the data "
                    "section starts at byte " + std::to_string(data_offset_) + " and the file has " +
                    std::to_string(size) + " bytes (truncated file?)");
    t.data = map_.data() + data_offset_ + t.offset;
  }
  // Two tensors may not share bytes: a writer that produced that has mixed up its offsets.
  std::vector<const GgufTensor*> by_offset;
  for (const GgufTensor& t : tensors_)
    if (t.nbytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    check(a.offset + a.nbytes <= b.offset, path_ + ": tensor '" + b.name + "' (data offset " +
                                               std::to_string(b.offset) + ") overlaps tensor '" + a.name +
                                               "' (data offset " + std::to_string(a.offset) + ", " +
                                               std::to_string(a.nbytes) + " bytes)");
  }
}

// ------------------------------------------------------------------------------------ GgufModel

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::path(path).extension() == ".gguf" && std::filesystem::is_regular_file(path, ec);
}

bool parse_gguf_split_name(const std::string& path, std::string* prefix, int* index, int* count) {
  const std::string suffix = ".gguf";
  if (path.size() < suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  const std::string stem = path.substr(0, path.size() - suffix.size());
  // stem = PREFIX-iiiii-of-nnnnn, each number at least 5 digits.
  auto digits_before = [&](size_t end, size_t* begin) {
    size_t b = end;
    while (b > 0 && std::isdigit(static_cast<unsigned char>(stem[b - 1]))) --b;
    *begin = b;
    return end - b >= 5 && end - b <= 9;
  };
  size_t n_begin = 0, i_begin = 0;
  if (!digits_before(stem.size(), &n_begin) || n_begin < 4 || stem.compare(n_begin - 4, 4, "-of-") != 0) return false;
  if (!digits_before(n_begin - 4, &i_begin) || i_begin < 2 || stem[i_begin - 1] != '-') return false;
  const int i = std::stoi(stem.substr(i_begin, n_begin - 4 - i_begin));
  const int n = std::stoi(stem.substr(n_begin));
  if (i < 1 || i > n) return false;
  *prefix = stem.substr(0, i_begin - 1);
  *index = i;
  *count = n;
  return true;
}

std::string gguf_split_name(const std::string& prefix, int index, int count) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05d-of-%05d.gguf", index, count);
  return prefix + buf;
}

GgufModel::GgufModel(const std::string& path) : path_(path) {
  std::string prefix;
  int index = 0, count = 0;
  const bool split_name = parse_gguf_split_name(path, &prefix, &index, &count);
  if (!split_name || count == 1) {
    files_.push_back(std::make_unique<GgufFile>(path));
    const GgufMetadata& md = files_[0]->metadata();
    if (md.has("split.count")) {
      const uint64_t n = md.get_uint("split.count");
      check(n <= 1, path + ": is one of " + std::to_string(n) + " split files (metadata split.count), but its "
                           "name does not follow " + gguf_split_name("NAME", 1, int(std::min<uint64_t>(n, 99999))) +
                           ", so the others cannot be found");
    }
  } else {
    for (int i = 1; i <= count; ++i) {
      const std::string p = gguf_split_name(prefix, i, count);
      std::error_code ec;
      check(std::filesystem::is_regular_file(p, ec),
            path + ": is split file " + std::to_string(index) + " of " + std::to_string(count) + ", but split file " +
                std::to_string(i) + " (" + p + ") is missing");
      files_.push_back(std::make_unique<GgufFile>(p));
      const GgufMetadata& md = files_.back()->metadata();
      const uint64_t no = md.get_uint("split.no"), n = md.get_uint("split.count");
      check(no == uint64_t(i - 1) && n == uint64_t(count),
            p + ": metadata says split.no " + std::to_string(no) + " of split.count " + std::to_string(n) +
                ", but its name makes it split " + std::to_string(i - 1) + " (counting from 0) of " +
                std::to_string(count));
    }
  }
  for (const auto& f : files_) {
    for (const GgufTensor& t : f->tensors()) {
      const auto [it, fresh] = tensors_.emplace(t.name, &t);
      check(fresh, f->path() + ": tensor '" + t.name + "' appears twice (also in " + it->second->file + ")");
    }
  }
  const GgufMetadata& md = metadata();
  if (md.has("split.tensors.count")) {
    const uint64_t n = md.get_uint("split.tensors.count");
    check(n == tensors_.size(), md.file() + ": metadata split.tensors.count says the split files hold " +
                                    std::to_string(n) + " tensors, but they hold " +
                                    std::to_string(tensors_.size()));
  }
}

const GgufTensor* GgufModel::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

}  // namespace petrel
