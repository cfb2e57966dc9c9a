// The GGUF reader: every metadata type, tensor infos and data, alignment, split files, and an error
// naming the file and the defect for each way a file can be broken.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "gguf_writer.h"
#include "io/gguf.h"
#include "test_util.h"

namespace petrel {
namespace {

namespace fs = std::filesystem;
using test::GgufWriter;
using test::TempDir;

std::vector<uint8_t> iota_bytes(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(start + i);
  return b;
}

// A small valid file: a few keys and three tensors of different types.
GgufWriter sample() {
  GgufWriter w;
  w.kv_string("general.architecture", "qwen3");
  w.kv("qwen3.block_count", GgufType::U32, uint32_t(2));
  w.tensor("token_embd.weight", GgmlType::F16, {4, 3}, iota_bytes(24));
  w.tensor("blk.0.attn_q.weight", GgmlType::Q8_0, {64, 2}, iota_bytes(4 * 34, 7));
  w.tensor("output_norm.weight", GgmlType::F32, {4}, iota_bytes(16, 100));
  return w;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string open_error(const GgufWriter& w, const TempDir& dir, const std::string& name = "model.gguf") {
  w.write(dir.str(name));
  return error_of([&] { GgufFile f(dir.str(name)); });
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

// ------------------------------------------------------------------------------------ reading

TEST(GgufReader, ReadsEveryMetadataType) {
  TempDir dir;
  GgufWriter w;
  w.kv("u8", GgufType::U8, uint8_t(200));
  w.kv("i8", GgufType::I8, int8_t(-100));
  w.kv("u16", GgufType::U16, uint16_t(60000));
  w.kv("i16", GgufType::I16, int16_t(-30000));
  w.kv("u32", GgufType::U32, uint32_t(4000000000u));
  w.kv("i32", GgufType::I32, int32_t(-2000000000));
  w.kv("f32", GgufType::F32, 1e-6f);
  w.kv("bool", GgufType::Bool, uint8_t(1));
  w.kv_string("string", "héllo");
  w.kv("u64", GgufType::U64, uint64_t(1) << 63);
  w.kv("i64", GgufType::I64, int64_t(-5000000000));
  w.kv("f64", GgufType::F64, 0.1);
  w.kv_strings("strings", {"a", "", "<|im_start|>"});
  w.kv_array("ints", GgufType::I32, std::vector<int32_t>{11, -1, 10, 0});
  w.kv_array("floats", GgufType::F32, std::vector<float>{0.5f, -2.0f});
  w.kv_array("empty", GgufType::U8, std::vector<uint8_t>{});
  w.write(dir.str("m.gguf"));
  GgufFile f(dir.str("m.gguf"));
  const GgufMetadata& md = f.metadata();
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(md.values().size(), 16u);
  EXPECT_EQ(md.get_uint("u8"), 200u);
  EXPECT_EQ(md.get_int("i8"), -100);
  EXPECT_EQ(md.get_uint("u16"), 60000u);
  EXPECT_EQ(md.get_int("i16"), -30000);
  EXPECT_EQ(md.get_uint("u32"), 4000000000u);
  EXPECT_EQ(md.get_int("u32"), 4000000000);
  EXPECT_EQ(md.get_int("i32"), -2000000000);
  EXPECT_EQ(md.get_float("f32"), double(1e-6f));
  EXPECT_EQ(md.get_float("u32"), 4e9);
  EXPECT_TRUE(md.get_bool("bool"));
  EXPECT_EQ(md.get_string("string"), "héllo");
  EXPECT_EQ(md.get_uint("u64"), uint64_t(1) << 63);
  EXPECT_EQ(md.get_int("i64"), -5000000000);
  EXPECT_EQ(md.get_float("f64"), 0.1);
  EXPECT_EQ(md.get_strings("strings"), (std::vector<std::string>{"a", "", "<|im_start|>"}));
  EXPECT_EQ(md.get_ints("ints"), (std::vector<int64_t>{11, -1, 10, 0}));
  EXPECT_EQ(md.get_floats("floats"), (std::vector<double>{0.5, -2.0}));
  EXPECT_EQ(md.find("empty")->type_str(), "ARRAY of UINT8");
  EXPECT_EQ(md.find("empty")->size(), 0u);
  EXPECT_EQ(md.find("strings")->size(), 3u);
  EXPECT_EQ(md.find("u64")->type_str(), "UINT64");
}

TEST(GgufReader, TypedGettersNameFileKeyAndTypes) {
  TempDir dir;
  GgufWriter w;
  w.kv("count", GgufType::I32, int32_t(-3));
  w.kv("huge", GgufType::U64, uint64_t(1) << 63);
  w.kv_string("name", "x");
  w.kv_array("ints", GgufType::U64, std::vector<uint64_t>{1, uint64_t(1) << 63});
  const std::string path = dir.str("m.gguf");
  w.write(path);
  GgufFile f(path);
  const GgufMetadata& md = f.metadata();
  EXPECT_EQ(error_of([&] { md.get_uint("missing"); }),
            path + ": missing metadata key 'missing' (expected an unsigned integer)");
  EXPECT_EQ(error_of([&] { md.get_uint("count"); }), path + ": metadata key 'count' is -3, expected a non-negative integer");
  EXPECT_EQ(error_of([&] { md.get_int("huge"); }),
            path + ": metadata key 'huge' is 9223372036854775808, too large for a 64-bit integer");
  EXPECT_EQ(error_of([&] { md.get_uint("name"); }), path + ": metadata key 'name' is STRING, expected an unsigned integer");
  EXPECT_EQ(error_of([&] { md.get_string("count"); }), path + ": metadata key 'count' is INT32, expected a STRING");
  EXPECT_EQ(error_of([&] { md.get_strings("name"); }),
            path + ": metadata key 'name' is STRING, expected an ARRAY of STRING");
  EXPECT_EQ(error_of([&] { md.get_floats("ints"); }),
            path + ": metadata key 'ints' is ARRAY of UINT64, expected an ARRAY of FLOAT32");
  EXPECT_EQ(error_of([&] { md.get_ints("ints"); }),
            path + ": metadata key 'ints': element 1 is 9223372036854775808, too large for a 64-bit integer");
  EXPECT_EQ(error_of([&] { md.get_bool("count"); }), path + ": metadata key 'count' is INT32, expected a BOOL");
}

TEST(GgufReader, ReadsTensorInfosAndData) {
  TempDir dir;
  sample().write(dir.str("m.gguf"));
  GgufFile f(dir.str("m.gguf"));
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.metadata().get_string("general.architecture"), "qwen3");
  const GgufTensor& e = f.tensors()[0];
  EXPECT_EQ(e.name, "token_embd.weight");
  EXPECT_EQ(e.file, dir.str("m.gguf"));
  EXPECT_EQ(e.type, GgmlType::F16);
  EXPECT_EQ(e.ne, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(e.shape_str(), "{4, 3}");
  EXPECT_EQ(e.numel(), 12);
  EXPECT_EQ(e.rows(), 3);
  EXPECT_EQ(e.nbytes, 24u);
  EXPECT_EQ(e.data, f.bytes().data() + f.data_offset());
  EXPECT_EQ(std::vector<uint8_t>(e.data, e.data + e.nbytes), iota_bytes(24));
  const GgufTensor& q = f.tensors()[1];
  EXPECT_EQ(q.type, GgmlType::Q8_0);
  EXPECT_EQ(q.offset, 32u);  // after 24 bytes, aligned to 32
  EXPECT_EQ(q.nbytes, 4u * 34);
  EXPECT_EQ(std::vector<uint8_t>(q.data, q.data + q.nbytes), iota_bytes(4 * 34, 7));
  const GgufTensor& n = f.tensors()[2];
  EXPECT_EQ(n.offset, 192u);
  EXPECT_EQ(std::vector<uint8_t>(n.data, n.data + n.nbytes), iota_bytes(16, 100));
}

TEST(GgufReader, HonoursGeneralAlignment) {
  TempDir dir;
  GgufWriter v;
  v.alignment = 256;
  v.kv("general.alignment", GgufType::U32, uint32_t(256));
  v.tensor("a", GgmlType::F32, {4}, iota_bytes(16));
  v.tensor("b", GgmlType::F32, {4}, iota_bytes(16, 50));
  v.write(dir.str("m.gguf"));
  GgufFile f(dir.str("m.gguf"));
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.data_offset() % 256, 0u);
  EXPECT_EQ(f.tensors()[1].offset, 256u);
  EXPECT_EQ(f.tensors()[1].data[0], 50);
}

TEST(GgufReader, ReadsVersion2AndEmptyFiles) {
  TempDir dir;
  GgufWriter w = sample();
  w.version = 2;
  w.write(dir.str("v2.gguf"));
  EXPECT_EQ(GgufFile(dir.str("v2.gguf")).tensors().size(), 3u);
  GgufWriter empty;
  empty.write(dir.str("empty.gguf"));
  GgufFile e(dir.str("empty.gguf"));
  EXPECT_TRUE(e.tensors().empty());
  EXPECT_TRUE(e.metadata().values().empty());
}

// ------------------------------------------------------------------------------------ errors

TEST(GgufReader, EveryTruncationIsAnErrorNamingTheFile) {
  TempDir dir;
  const std::vector<uint8_t> full = sample().bytes();
  const std::string path = dir.str("cut.gguf");
  for (size_t n = 0; n < full.size(); ++n) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(full.data()), std::streamsize(n));
    const std::string msg = error_of([&] { GgufFile f(path); });
    ASSERT_EQ(msg.rfind(path + ": ", 0), 0u) << "cut at " << n << ": " << msg;
    const bool says = msg.find("truncated") != std::string::npos || msg.find("too short") != std::string::npos;
    ASSERT_TRUE(says) << "cut at " << n << ": " << msg;
  }
}

TEST(GgufReader, TruncationMessagesSayWhatWasBeingRead) {
  TempDir dir;
  const std::vector<uint8_t> full = sample().bytes();
  const std::string path = dir.str("cut.gguf");
  auto cut = [&](size_t n) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(full.data()), std::streamsize(n));
    return error_of([&] { GgufFile f(path); });
  };
  EXPECT_EQ(cut(2), path + ": not a GGUF file: 2 bytes, too short for the magic 'GGUF'");
  EXPECT_EQ(cut(51), path + ": truncated file: the key of metadata key/value 0 of 2 at byte 32 needs 20 bytes, but "
                            "the file ends at byte 51");
  // The last tensor's data is cut short.
  const std::string msg = cut(full.size() - 1);
  EXPECT_HAS(msg, "tensor 'output_norm.weight' {4} of F32 (16 bytes at data offset 192) ends past the end of the file");
  EXPECT_HAS(msg, "(truncated file?)");
}

TEST(GgufReader, RefusesOtherFilesAndVersions) {
  TempDir dir;
  GgufWriter w = sample();
  w.magic = 0x4c4c4747;
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": not a GGUF file: it starts with 0x4c4c4747 (as a little-endian "
                                                        "u32), expected the magic 'GGUF' (0x46554747)");
  w = sample();
  w.version = 1;
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": GGUF version 1 is not supported (expected 2 or 3)");
  w.version = 3u << 24;
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": a big-endian GGUF file (version field 0x03000000); Petrel "
                                                        "reads little-endian GGUF files only");
}

TEST(GgufReader, RefusesAbsurdCounts) {
  TempDir dir;
  GgufWriter w = sample();
  w.tensor_count = uint64_t(1) << 60;
  EXPECT_HAS(open_error(w, dir), "truncated file: the header announces 1152921504606846976 tensors, but only");
  w = sample();
  w.kv_count = 1000000;
  EXPECT_HAS(open_error(w, dir), "truncated file: the header announces 1000000 metadata key/values, but only");
  w = GgufWriter();
  std::vector<uint8_t> arr;
  GgufWriter::put(arr, uint32_t(GgufType::U32));
  GgufWriter::put(arr, uint64_t(1) << 62);
  w.kv_raw("tokenizer.ggml.token_type", uint32_t(GgufType::Array), arr);
  EXPECT_HAS(open_error(w, dir), ": truncated file: metadata key 'tokenizer.ggml.token_type' is an array of "
                                 "4611686018427387904 UINT32 values, but only 23 bytes of the file are left");
  w = GgufWriter();
  std::vector<uint8_t> str;
  GgufWriter::put(str, uint64_t(1) << 40);
  w.kv_raw("general.name", uint32_t(GgufType::String), str);
  EXPECT_HAS(open_error(w, dir), ": truncated file: a STRING of metadata key 'general.name' at byte 56 needs "
                                 "1099511627776 bytes");
}

TEST(GgufReader, RefusesBadValueTypes) {
  TempDir dir;
  GgufWriter w;
  w.kv_raw("general.x", 13, {0});
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": metadata key 'general.x' has value type 13, which is no "
                                                        "GGUF type (expected 0 to 12)");
  w = GgufWriter();
  std::vector<uint8_t> nested;
  GgufWriter::put(nested, uint32_t(GgufType::Array));
  GgufWriter::put(nested, uint64_t(0));
  w.kv_raw("general.nested", uint32_t(GgufType::Array), nested);
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": metadata key 'general.nested' is an array of arrays, which "
                                                        "Petrel does not read (nor does ggml)");
  w = GgufWriter();
  w.kv("a", GgufType::U8, uint8_t(1));
  w.kv("a", GgufType::U8, uint8_t(2));
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": metadata key 'a' appears twice");
}

TEST(GgufReader, RefusesBadAlignment) {
  TempDir dir;
  GgufWriter w = sample();
  w.kv("general.alignment", GgufType::U32, uint32_t(48));
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": metadata key 'general.alignment' is 48, expected a power of two");
  w = sample();
  w.kv("general.alignment", GgufType::U64, uint64_t(64));
  EXPECT_EQ(open_error(w, dir), dir.str("model.gguf") + ": metadata key 'general.alignment' is UINT64, expected a UINT32");
}

TEST(GgufReader, RefusesBadTensorInfos) {
  TempDir dir;
  const std::string p = dir.str("model.gguf");
  GgufWriter w;
  w.tensor_raw("blk.0.ffn_up.weight", 4, {32, 2}, 0);
  EXPECT_EQ(open_error(w, dir), p + ": tensor 'blk.0.ffn_up.weight' has ggml type id 4, which is no ggml type Petrel "
                                    "knows (a retired id, or a file newer than Petrel)");
  w = GgufWriter();
  w.tensor_raw("t", uint32_t(GgmlType::Q4_K), {100, 2}, 0);
  EXPECT_EQ(open_error(w, dir), p + ": tensor 't' of type Q4_K has rows of 100 elements, which is not a multiple of "
                                    "the type's block of 256");
  w = GgufWriter();
  w.tensor_raw("t", uint32_t(GgmlType::F32), {1, 1, 1, 1, 1}, 0);
  EXPECT_EQ(open_error(w, dir), p + ": tensor 't' has 5 dims, expected at most 4");
  w = GgufWriter();
  w.tensor_raw("t", uint32_t(GgmlType::F32), {uint64_t(1) << 40, uint64_t(1) << 40}, 0);
  EXPECT_EQ(open_error(w, dir), p + ": tensor 't': dim 1 (1099511627776) makes the element count overflow 64 bits");
  w = GgufWriter();
  w.tensor("t", GgmlType::F32, {4}, iota_bytes(16));
  w.tensor("t", GgmlType::F32, {4}, iota_bytes(16));
  EXPECT_EQ(open_error(w, dir), p + ": tensor 't' appears twice");
}

TEST(GgufReader, RefusesBadOffsets) {
  TempDir dir;
  const std::string p = dir.str("model.gguf");
  GgufWriter w;
  w.tensor("a", GgmlType::F32, {4}, iota_bytes(16));
  w.tensor("b", GgmlType::F32, {4}, iota_bytes(16), 8);
  EXPECT_EQ(open_error(w, dir), p + ": tensor 'b' has data offset 8, not a multiple of the alignment 32");
  w = GgufWriter();
  w.tensor("a", GgmlType::F32, {16}, iota_bytes(64));
  w.tensor("b", GgmlType::F32, {4}, iota_bytes(16), 32);
  EXPECT_EQ(open_error(w, dir), p + ": tensor 'b' (data offset 32) overlaps tensor 'a' (data offset 0, 64 bytes)");
  w = GgufWriter();
  w.tensor("a", GgmlType::F32, {4}, iota_bytes(16));
  w.tensor_raw("far", uint32_t(GgmlType::F32), {4}, uint64_t(1) << 62);
  const std::string msg = open_error(w, dir);
  EXPECT_HAS(msg, p + ": tensor 'far' {4} of F32 (16 bytes at data offset 4611686018427387904) ends past the end of "
                      "the file: the data section starts at byte ");
}

// ------------------------------------------------------------------------------------ split files

TEST(GgufSplit, ParsesAndFormatsSplitNames) {
  std::string prefix;
  int i = 0, n = 0;
  EXPECT_TRUE(parse_gguf_split_name("/m/Qwen3-30B-A3B-Q4_K_M-00002-of-00003.gguf", &prefix, &i, &n));
  EXPECT_EQ(prefix, "/m/Qwen3-30B-A3B-Q4_K_M");
  EXPECT_EQ(i, 2);
  EXPECT_EQ(n, 3);
  EXPECT_EQ(gguf_split_name(prefix, 3, 3), "/m/Qwen3-30B-A3B-Q4_K_M-00003-of-00003.gguf");
  for (const char* name : {"/m/model.gguf", "/m/model-0001-of-0003.gguf", "/m/model-00004-of-00003.gguf",
                           "/m/model-00000-of-00003.gguf", "/m/model-00001-of-00003.safetensors", "-00001-of-00002.gguf",
                           "/m/model00001-of-00002.gguf"})
    EXPECT_FALSE(parse_gguf_split_name(name, &prefix, &i, &n)) << name;
}

// Shards of one model as gguf-split writes them: all metadata in the first, split.* in each.
void write_shards(const TempDir& dir, int count, int tensors_total) {
  for (int s = 0; s < count; ++s) {
    GgufWriter w;
    if (s == 0) w.kv_string("general.architecture", "qwen3");
    w.kv("split.no", GgufType::U16, uint16_t(s));
    w.kv("split.count", GgufType::U16, uint16_t(count));
    w.kv("split.tensors.count", GgufType::I32, int32_t(tensors_total));
    w.tensor("blk." + std::to_string(s) + ".a.weight", GgmlType::F32, {4}, iota_bytes(16, uint8_t(s * 16)));
    w.tensor("blk." + std::to_string(s) + ".b.weight", GgmlType::F32, {4}, iota_bytes(16, uint8_t(s * 16 + 8)));
    w.write(gguf_split_name(dir.str("m"), s + 1, count));
  }
}

TEST(GgufSplit, OpensEveryShardFromAnyOfThem) {
  TempDir dir;
  write_shards(dir, 3, 6);
  for (int s = 1; s <= 3; ++s) {
    GgufModel m(gguf_split_name(dir.str("m"), s, 3));
    ASSERT_EQ(m.files().size(), 3u);
    EXPECT_EQ(m.files()[0]->path(), dir.str("m-00001-of-00003.gguf"));
    EXPECT_EQ(m.metadata().get_string("general.architecture"), "qwen3");
    EXPECT_EQ(m.tensors().size(), 6u);
    const GgufTensor* t = m.find("blk.2.b.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->file, dir.str("m-00003-of-00003.gguf"));
    EXPECT_EQ(t->data[0], 40);
    EXPECT_EQ(m.find("blk.3.a.weight"), nullptr);
  }
}

TEST(GgufSplit, OneFileIsAModelToo) {
  TempDir dir;
  sample().write(dir.str("model.gguf"));
  GgufModel m(dir.str("model.gguf"));
  EXPECT_EQ(m.files().size(), 1u);
  EXPECT_EQ(m.tensors().size(), 3u);
  EXPECT_NE(m.find("output_norm.weight"), nullptr);
}

TEST(GgufSplit, MissingShardIsNamed) {
  TempDir dir;
  write_shards(dir, 3, 6);
  fs::remove(dir.str("m-00002-of-00003.gguf"));
  EXPECT_EQ(error_of([&] { GgufModel m(dir.str("m-00001-of-00003.gguf")); }),
            dir.str("m-00001-of-00003.gguf") + ": is split file 1 of 3, but split file 2 (" +
                dir.str("m-00002-of-00003.gguf") + ") is missing");
}

TEST(GgufSplit, ShardMetadataMustAgreeWithItsName) {
  TempDir dir;
  write_shards(dir, 2, 4);
  fs::rename(dir.str("m-00001-of-00002.gguf"), dir.str("tmp.gguf"));
  fs::rename(dir.str("m-00002-of-00002.gguf"), dir.str("m-00001-of-00002.gguf"));
  fs::rename(dir.str("tmp.gguf"), dir.str("m-00002-of-00002.gguf"));
  EXPECT_EQ(error_of([&] { GgufModel m(dir.str("m-00002-of-00002.gguf")); }),
            dir.str("m-00001-of-00002.gguf") + ": metadata says split.no 1 of split.count 2, but its name makes it split "
                                               "0 (counting from 0) of 2");
}

TEST(GgufSplit, TensorCountMustMatch) {
  TempDir dir;
  write_shards(dir, 2, 5);
  EXPECT_EQ(error_of([&] { GgufModel m(dir.str("m-00001-of-00002.gguf")); }),
            dir.str("m-00001-of-00002.gguf") + ": metadata split.tensors.count says the split files hold 5 tensors, "
                                               "but they hold 4");
}

TEST(GgufSplit, RenamedShardIsRefused) {
  TempDir dir;
  write_shards(dir, 2, 4);
  fs::rename(dir.str("m-00001-of-00002.gguf"), dir.str("model.gguf"));
  EXPECT_EQ(error_of([&] { GgufModel m(dir.str("model.gguf")); }),
            dir.str("model.gguf") + ": is one of 2 split files (metadata split.count), but its name does not follow "
                                    "NAME-00001-of-00002.gguf, so the others cannot be found");
}

TEST(GgufSplit, TensorInTwoShardsIsRefused) {
  TempDir dir;
  for (int s = 0; s < 2; ++s) {
    GgufWriter w;
    w.kv("split.no", GgufType::U16, uint16_t(s));
    w.kv("split.count", GgufType::U16, uint16_t(2));
    w.tensor("same.weight", GgmlType::F32, {4}, iota_bytes(16));
    w.write(gguf_split_name(dir.str("m"), s + 1, 2));
  }
  EXPECT_EQ(error_of([&] { GgufModel m(dir.str("m-00001-of-00002.gguf")); }),
            dir.str("m-00002-of-00002.gguf") + ": tensor 'same.weight' appears twice (also in " +
                dir.str("m-00001-of-00002.gguf") + ")");
}

}  // namespace
}  // namespace petrel
