#include "io/quant_config.h"

#include "core/error.h"

namespace petrel {
namespace {

using json = nlohmann::json;

const char* kSupported =
    "supported: unquantized F32/F16/BF16 weights, MLX affine 4/8-bit (config field 'quantization'), fine-grained "
    "FP8 (quant_method \"fp8\": e4m3 weights with block scales), and GGUF files";

// Optional string field `key` of `q` that must equal `want` when present.
void expect_string(const json& q, const char* key, const char* want, const std::string& where) {
  if (!q.contains(key) || q[key].is_null()) return;
  check(q[key].is_string() && q[key].get<std::string>() == want,
        where + "." + key + " is " + q[key].dump() + "; petrel reads \"" + want + "\" only");
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
  if (q.contains("modules_to_not_convert") && !q["modules_to_not_convert"].is_null()) {
    const json& m = q["modules_to_not_convert"];
    bool strings = m.is_array();
    for (const json& e : m) strings = strings && e.is_string();
    check(strings, where + ".modules_to_not_convert is " + m.dump() + "; expected a list of module names");
  }
  return c;
}

}  // namespace

void refuse_foreign_quant_tensor(const std::string& file, const std::string& name) {
  static const struct { const char* suffix; const char* method; } kForeign[] = {
      {".qweight", "GPTQ or AWQ"}, {".qzeros", "GPTQ or AWQ"}, {".absmax", "bitsandbytes"}};
  for (const auto& f : kForeign) {
    const std::string suffix = f.suffix;
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      throw Error(file + ": tensor '" + name + "' holds " + f.method + "-quantized weights, which petrel cannot read (" +
                  kSupported + ")");
  }
}

QuantConfig parse_quant_config(const json& root, const std::string& cfg_path) {
  const std::string where = cfg_path + ": quantization_config";
  if (root.contains("quantization_config") && root["quantization_config"].is_object()) {
    const json& q = root["quantization_config"];
    // MLX writes a copy of "quantization" here, without quant_method.
    if (q.contains("quant_method")) {
      const json& m = q["quant_method"];
      check(m.is_string(), where + ".quant_method is " + m.dump() + "; expected a string (" + kSupported + ")");
      check(m.get<std::string>() == "fp8", where + ".quant_method is " + m.dump() +
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
