#include "io/quant_config.h"

#include <algorithm>

#include "core/error.h"

namespace petrel {
namespace {

using json = nlohmann::json;

const char* kSupported =
    "supported: unquantized F32/F16/BF16 weights, MLX affine 4/8-bit (config field 'quantization'), fine-grained "
    "FP8 (quant_method \"fp8\": e4m3 weights with block scales), GPTQ 4/8-bit and AWQ gemm 4-bit (quant_method "
    "\"gptq\", \"awq\"), and GGUF files";

// Optional string field `key` of `q` that must equal `want` when present.
void expect_string(const json& q, const char* key, const char* want, const std::string& where) {
  if (!q.contains(key) || q[key].is_null()) return;
  check(q[key].is_string() && q[key].get<std::string>() == want,
        where + "." + key + " is " + q[key].dump() + "; petrel reads \"" + want + "\" only");
}

void check_module_list(const json& q, const std::string& where) {
  if (!q.contains("modules_to_not_convert") || q["modules_to_not_convert"].is_null()) return;
  const json& m = q["modules_to_not_convert"];
  bool strings = m.is_array();
  for (const json& e : m) strings = strings && e.is_string();
  check(strings, where + ".modules_to_not_convert is " + m.dump() + "; expected a list of module names");
}

// Integer field `key` of `q`, which must be present and one of `allowed` (any value >= 1 when empty).
int int_field(const json& q, const char* key, std::initializer_list<int> allowed, const std::string& what,
              const std::string& where) {
  const std::string field = where + "." + key;
  check(q.contains(key) && !q[key].is_null(), field + " is missing; expected " + what);
  const json& v = q[key];
  bool ok = v.is_number_integer() && v.get<int64_t>() >= -(1 << 16) && v.get<int64_t>() <= 1 << 16;
  if (ok && allowed.size()) ok = std::find(allowed.begin(), allowed.end(), v.get<int>()) != allowed.end();
  if (ok && !allowed.size()) ok = v.get<int>() >= 1;
  check(ok, field + " is " + v.dump() + "; petrel reads " + what);
  return v.get<int>();
}

// Optional boolean field `key` of `q` that must equal `want` when present.
void expect_bool(const json& q, const char* key, bool want, const std::string& where) {
  if (!q.contains(key) || q[key].is_null()) return;
  check(q[key].is_boolean() && q[key].get<bool>() == want,
        where + "." + key + " is " + q[key].dump() + "; petrel reads " + (want ? "true" : "false") + " only");
}

int group_size(const json& q, const std::string& where) {
  const std::string what = "a group size of at least 1, or -1 (one group per row)";
  if (q.contains("group_size") && q["group_size"].is_number_integer() && q["group_size"].get<int64_t>() == -1)
    return -1;
  return int_field(q, "group_size", {}, what, where);
}

// GPTQ (AutoGPTQ / GPTQModel / optimum): act-order (desc_act) is judged per tensor from g_idx.
QuantConfig parse_gptq(const json& q, const std::string& where) {
  QuantConfig c;
  c.method = QuantMethod::Gptq;
  c.bits = int_field(q, "bits", {4, 8}, "4 or 8 bits", where);
  c.group_size = group_size(q, where);
  std::string format = "gptq";
  if (q.contains("checkpoint_format") && !q["checkpoint_format"].is_null()) {
    const json& f = q["checkpoint_format"];
    check(f.is_string() && (f == "gptq" || f == "gptq_v2"),
          where + ".checkpoint_format is " + f.dump() + "; petrel reads \"gptq\" or \"gptq_v2\"");
    format = f.get<std::string>();
  }
  c.zeros_minus_one = format == "gptq";
  check_module_list(q, where);
  return c;
}

// AWQ (AutoAWQ / transformers): the gemm layout with zero points only.
QuantConfig parse_awq(const json& q, const std::string& where) {
  QuantConfig c;
  c.method = QuantMethod::Awq;
  c.bits = int_field(q, "bits", {4}, "4 bits", where);
  c.group_size = group_size(q, where);
  // AutoAWQ's own files spell the version in capitals; transformers lowercases it.
  if (!(q.contains("version") && q["version"] == "GEMM")) expect_string(q, "version", "gemm", where);
  expect_bool(q, "zero_point", true, where);
  check_module_list(q, where);
  return c;
}

QuantConfig parse_fp8(const json& q, const std::string& where) {
  expect_string(q, "fmt", "e4m3", where);
  // Activations are never quantized here (the CPU computes in fp32, the GPU in bf16), so only
  // a scheme that stores no activation scales is accepted.
  expect_string(q, "activation_scheme", "dynamic", where);
  QuantConfig c;
  c.method = QuantMethod::Fp8;
  c.block_rows = c.block_cols = 128;  // transformers' default when the field is absent
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const json& b = q["weight_block_size"];
    auto valid = [](const json& v) {
      return v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 1 << 16;
    };
    check(b.is_array() && b.size() == 2 && valid(b[0]) && valid(b[1]),
          where + ".weight_block_size is " + b.dump() +
              "; expected [rows, cols] of two integers in [1, 65536], such as [128, 128]");
    c.block_rows = b[0].get<int>();
    c.block_cols = b[1].get<int>();
  }
  check_module_list(q, where);
  return c;
}

}  // namespace

void refuse_foreign_quant_tensor(const std::string& file, const std::string& name, QuantMethod declared) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends(".absmax"))
    throw Error(file + ": tensor '" + name + "' holds bitsandbytes-quantized weights, which petrel cannot read (" +
                kSupported + ")");
  // Older GPTQ folders keep their settings in quantize_config.json, which petrel does not read.
  if ((ends(".qweight") || ends(".qzeros")) && declared != QuantMethod::Gptq && declared != QuantMethod::Awq)
    throw Error(file + ": tensor '" + name + "' holds GPTQ or AWQ-quantized weights, but config.json has no "
                "quantization_config with quant_method \"gptq\" or \"awq\" giving their bits and group_size");
}

QuantConfig parse_quant_config(const json& root, const std::string& cfg_path) {
  const std::string where = cfg_path + ": quantization_config";
  if (root.contains("quantization_config") && root["quantization_config"].is_object()) {
    const json& q = root["quantization_config"];
    // MLX writes a copy of "quantization" here, without quant_method.
    if (q.contains("quant_method")) {
      const json& m = q["quant_method"];
      check(m.is_string(), where + ".quant_method is " + m.dump() + "; expected a string (" + kSupported + ")");
      const std::string method = m.get<std::string>();
      if (method == "gptq") return parse_gptq(q, where);
      if (method == "awq") return parse_awq(q, where);
      check(method == "fp8", where + ".quant_method is " + m.dump() +
                                 ": petrel cannot read weights quantized this way (" + kSupported + ")");
      return parse_fp8(q, where);
    }
  }
  QuantConfig c;
  for (const char* key : {"quantization", "quantization_config"}) {
    if (root.contains(key) && root[key].is_object()) {
      c.method = QuantMethod::MlxAffine;
      c.mlx = root[key];
      break;
    }
  }
  return c;
}

}  // namespace petrel
