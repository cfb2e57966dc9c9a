// GGUF files whose matrices are K-quants, as local users have them (llama.cpp's Q4_K_M: Q4_K for
// most matrices, Q6_K for the LM head and some attn_v / ffn_down, Q5_K, Q8_0 and F32 for others).
// K-quant rows are whole blocks of 256, wider than the fixtures' rows, so the model here is a
// random hybrid (qwen35moe, qwen3next) with every matrix row a multiple of 256, converted as
// llama.cpp's converter does (gguf_hybrid_convert.h) and its matrices encoded by kquant_encode.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <ostream>
#include <random>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_logits.h"
#include "core/dtype.h"
#include "gguf_hybrid_convert.h"
#include "io/checkpoint.h"
#include "kquant_encode.h"
#include "test_util.h"

namespace petrel {
namespace {

using nlohmann::json;
using test::RawTensor;
using test::TempDir;

constexpr double kPi = 3.14159265358979323846;
// Experts are kShared·common + kOwn·own (unit variance): a random router has near ties, which any
// rounding flips, and fully independent experts would turn each flip into a jump in the logits.
constexpr double kOwn = 0.3, kShared = 0.953939201416946;  // sqrt(1 - kOwn²)

// Normal samples from mt19937's fixed sequence (Box-Muller), the same on every standard library.
struct Normal {
  std::mt19937 gen;
  double uniform() { return (double(gen()) + 0.5) / 4294967296.0; }
  float operator()(double mean, double std) {
    return float(mean + std * std::sqrt(-2 * std::log(uniform())) * std::cos(2 * kPi * uniform()));
  }
};

RawTensor bf16_tensor(std::vector<int64_t> shape, const std::function<float()>& value) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  RawTensor t{"BF16", std::move(shape), std::vector<uint8_t>(size_t(2 * n))};
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(value());
    std::memcpy(t.bytes.data() + 2 * i, &h, 2);
  }
  return t;
}

// The fixture's config with every matrix row (input dim) 256 wide, and BF16 weights drawn from
// `seed`: matrices N(0, 1/fan_in), norms near their unit multiplier, Hv = 2·Hk value heads so
// that Qwen3.5's value-head reorder moves rows and columns.
void write_random_model(const std::string& fixture, const std::string& dir, uint32_t seed) {
  json cfg = json::parse(std::ifstream(test::fixture_model(fixture) + "/config.json"));
  const int64_t H = 256, V = 512, D = 64, Hq = 4, Hkv = 2, Hk = 2, Hv = 4, dk = 64, dv = 64, I = 256, Is = 256;
  const int64_t E = 8, K = 4, L = cfg["num_hidden_layers"];
  cfg.update(json{{"hidden_size", H}, {"vocab_size", V}, {"head_dim", D}, {"num_attention_heads", Hq},
                  {"num_key_value_heads", Hkv}, {"linear_num_key_heads", Hk}, {"linear_num_value_heads", Hv},
                  {"linear_key_head_dim", dk}, {"linear_value_head_dim", dv}, {"moe_intermediate_size", I},
                  {"shared_expert_intermediate_size", Is}, {"num_experts", E}, {"num_experts_per_tok", 2},
                  {"linear_conv_kernel_dim", K}});
  if (cfg.contains("intermediate_size")) cfg["intermediate_size"] = I;
  const bool next = cfg["model_type"] == "qwen3_next";
  std::ofstream(dir + "/config.json") << cfg.dump(2);

  Normal normal{std::mt19937(seed)};
  std::map<std::string, RawTensor> t;
  const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    t[name] = bf16_tensor({rows, cols}, [&] { return normal(0, 1 / std::sqrt(double(cols))); });
  };
  // Qwen3-Next norms multiply by (1 + w); linear_attn.norm multiplies by w.
  const auto norm = [&](const std::string& name, int64_t n, double center) {
    t[name] = bf16_tensor({n}, [&] { return normal(center, 0.1); });
  };
  t["model.embed_tokens.weight"] = bf16_tensor({V, H}, [&] { return normal(0, 1); });
  matrix("lm_head.weight", V, H);
  norm("model.norm.weight", H, 0);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm.weight", H, 0);
    norm(p + "post_attention_layernorm.weight", H, 0);
    const bool linear = next ? (l + 1) % cfg["full_attention_interval"].get<int64_t>() != 0
                             : cfg["layer_types"][l] == "linear_attention";
    if (linear) {
      const std::string a = p + "linear_attn.";
      const int64_t C = 2 * Hk * dk + Hv * dv;
      if (next) {
        matrix(a + "in_proj_qkvz.weight", C + Hv * dv, H);
        matrix(a + "in_proj_ba.weight", 2 * Hv, H);
      } else {
        matrix(a + "in_proj_qkv.weight", C, H);
        matrix(a + "in_proj_z.weight", Hv * dv, H);
        matrix(a + "in_proj_b.weight", Hv, H);
        matrix(a + "in_proj_a.weight", Hv, H);
      }
      t[a + "conv1d.weight"] = bf16_tensor({C, 1, K}, [&] { return normal(0, 0.5); });
      t[a + "dt_bias"] = bf16_tensor({Hv}, [&] { return normal(0, 0.5); });
      t[a + "A_log"] = bf16_tensor({Hv}, [&] { return float(std::log(1 + 15 * normal.uniform())); });
      norm(a + "norm.weight", dv, 1);
      matrix(a + "out_proj.weight", H, Hv * dv);
    } else {
      const std::string a = p + "self_attn.";
      matrix(a + "q_proj.weight", 2 * Hq * D, H);
      matrix(a + "k_proj.weight", Hkv * D, H);
      matrix(a + "v_proj.weight", Hkv * D, H);
      matrix(a + "o_proj.weight", H, Hq * D);
      norm(a + "q_norm.weight", D, 0);
      norm(a + "k_norm.weight", D, 0);
    }
    const std::string m = p + "mlp.";
    matrix(m + "gate.weight", E, H);
    for (const auto& [proj, rows, cols] : {std::tuple{"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}}) {
      std::vector<float> common(size_t(rows * cols));
      for (float& x : common) x = normal(0, 1 / std::sqrt(double(cols)));
      for (int64_t e = 0; e < E; ++e) {
        size_t i = 0;
        t[m + "experts." + std::to_string(e) + "." + proj + ".weight"] = bf16_tensor({rows, cols}, [&] {
          return float(kShared * common[i++] + kOwn * normal(0, 1 / std::sqrt(double(cols))));
        });
      }
    }
    matrix(m + "shared_expert.gate_proj.weight", Is, H);
    matrix(m + "shared_expert.up_proj.weight", Is, H);
    matrix(m + "shared_expert.down_proj.weight", H, Is);
    matrix(m + "shared_expert_gate.weight", 1, H);
  }
  test::write_safetensors(dir + "/model.safetensors", t);
}

// A ggml type per GGUF tensor name (the 2-D tensors the converter stores as BF16).
using Mix = std::function<GgmlType(const std::string& name)>;

// llama.cpp's Q4_K_M choice, as far as this model has its tensors: Q6_K for the LM head and for
// attn_v / ffn_down in the layers that get more bits (the first and last eighth, and every third
// between), Q5_K for attn_qkv (and the shared expert's down_proj here), Q8_0 for the small gate
// projections, Q4_K for the rest. Both models alternate DeltaNet and attention layers.
GgmlType q4_k_m(const std::string& name) {
  constexpr int kLayers = 4;
  const auto more_bits = [](int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  std::smatch m;
  const int layer = std::regex_search(name, m, std::regex(R"(^blk\.(\d+)\.)")) ? std::stoi(m[1].str()) : -1;
  if (name == "output.weight") return GgmlType::Q6_K;
  if (name.find("attn_v.weight") != std::string::npos)
    return more_bits(layer / 2, kLayers / 2) ? GgmlType::Q6_K : GgmlType::Q4_K;
  if (name.find("ffn_down_exps") != std::string::npos)
    return more_bits(layer, kLayers) ? GgmlType::Q6_K : GgmlType::Q4_K;
  if (name.find("attn_qkv") != std::string::npos || name.find("ffn_down_shexp") != std::string::npos)
    return GgmlType::Q5_K;
  if (name.find("ssm_alpha") != std::string::npos || name.find("ssm_beta") != std::string::npos ||
      name.find("ssm_ba") != std::string::npos)
    return GgmlType::Q8_0;
  return GgmlType::Q4_K;
}

struct Case {
  std::string fixture, mix_name;
  Mix mix;
  double mean_cosine, min_cosine;  // bounds on the positions' logit cosines against the unquantized model
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << " " << c.mix_name; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return test::param_name(info.param.fixture + "_" + info.param.mix_name);
}

// The random model's folder, its GGUF with the mix's blocks, and an F32 GGUF holding exactly the
// values those blocks decode to.
struct Files {
  TempDir dir;
  std::string hf = dir.str("hf"), quant = dir.str("quant.gguf"), decoded = dir.str("decoded.gguf");

  explicit Files(const Case& c) {
    std::filesystem::create_directories(hf);
    write_random_model(c.fixture, hf, 66);
    const auto encode = [&](bool decode) {
      return [&c, decode](const std::string& name, const std::vector<uint64_t>& ne, const std::vector<float>& v,
                          GgmlType* type, std::vector<uint8_t>* bytes) {
        const GgmlType t = c.mix(name);
        *bytes = test::ggml_encode(t, v.data(), int64_t(v.size()));
        *type = t;
        if (!decode) return;
        std::vector<float> x(v.size());
        const int64_t row = int64_t(ne[0]), row_bytes = ggml_row_bytes(t, row);
        for (size_t r = 0; r < v.size() / size_t(row); ++r)
          ggml_dequantize_row(t, bytes->data() + r * row_bytes, row, x.data() + r * row);
        *type = GgmlType::F32;
        bytes->resize(4 * x.size());
        std::memcpy(bytes->data(), x.data(), bytes->size());
      };
    };
    test::hybrid::convert(hf, quant, 0, encode(false));
    test::hybrid::convert(hf, decoded, 0, encode(true));
  }
};

// 24 ids drawn from the 512-token vocabulary.
std::vector<int32_t> prompt() {
  std::mt19937 gen(24);
  std::vector<int32_t> ids(24);
  for (int32_t& id : ids) id = int32_t(gen() % 512);
  return ids;
}

class GgufKQuant : public ::testing::TestWithParam<Case> {};

// The blocks are read in place (embedding rows, row maps over attn_q and the DeltaNet inputs,
// expert slices of stacked tensors, ssm_out's columns moved) and decode as the F32 copy reads.
TEST_P(GgufKQuant, GivesTheLogitsOfItsDecodedValues) {
  const Files f(GetParam());
  const auto quant = Checkpoint::open(f.quant), decoded = Checkpoint::open(f.decoded);
  const ModelWeights& W = quant->weights();
  const Mix& mix = GetParam().mix;
  for (const auto& [m, name] : {std::pair{&W.embed, "token_embd.weight"}, {&W.lm_head, "output.weight"},
                                {&W.layers[0].ffn.experts[1].down, "blk.0.ffn_down_exps.weight"},
                                {&W.layers[3].ffn.experts[1].down, "blk.3.ffn_down_exps.weight"},
                                {&W.layers[3].attn.v, "blk.3.attn_v.weight"}}) {
    EXPECT_EQ(m->format, MatrixFormat::Gguf) << name;
    EXPECT_EQ(m->ggml, mix(name)) << name;
  }
  const std::vector<int32_t> ids = prompt();
  test::expect_logits_within(test::prompt_logits(*decoded, ids), test::prompt_logits(*quant, ids), 1e-5f);
}

// The rounded weights stay close to the unquantized model's logits at every position.
TEST_P(GgufKQuant, StaysNearTheUnquantizedModel) {
  const Files f(GetParam());
  const auto quant = Checkpoint::open(f.quant), hf = Checkpoint::open(f.hf);
  const std::vector<int32_t> ids = prompt();
  const int vocab = quant->config().vocab;
  const std::vector<double> cos =
      test::row_cosines(test::prompt_logits(*hf, ids), test::prompt_logits(*quant, ids), int(ids.size()), vocab);
  double worst = 1, sum = 0;
  for (double c : cos) {
    worst = std::min(worst, c);
    sum += c;
  }
  std::printf("%s %s: logit cosine min %.5f, mean %.5f; per position:", GetParam().fixture.c_str(),
              GetParam().mix_name.c_str(), worst, sum / double(cos.size()));
  for (double c : cos) std::printf(" %.4f", c);
  std::printf("\n");
  EXPECT_GE(sum / double(cos.size()), GetParam().mean_cosine);
  EXPECT_GE(worst, GetParam().min_cosine);
}

Mix all(GgmlType t) {
  return [t](const std::string&) { return t; };
}

// The bar for K-quant mixes on real models is a logit cosine of 0.99; random weights have no
// redundancy and amplify every rounding (Q4_K on the LM head alone gives 0.996, on the embedding
// alone 0.90-0.93, on a DeltaNet in_proj_qkv alone 0.62 at one position), so the bounds are those
// measured here less a margin. Mean / min, qwen35moe then qwen3next: Q4_K_M 0.960 / 0.932 and
// 0.948 / 0.733, Q5_K 0.979 / 0.915 and 0.976 / 0.801, Q6_K 0.9957 / 0.978 and 0.9921 / 0.976,
// Q8_0 0.9993 / 0.993 and 0.9994 / 0.9945.
INSTANTIATE_TEST_SUITE_P(Gguf, GgufKQuant,
                         ::testing::Values(Case{"qwen35moe-text-per-expert", "Q4_K_M", q4_k_m, 0.94, 0.85},
                                           Case{"qwen3next-sharded", "Q4_K_M", q4_k_m, 0.93, 0.65},
                                           Case{"qwen35moe-text-per-expert", "Q5_K", all(GgmlType::Q5_K), 0.96, 0.85},
                                           Case{"qwen3next-sharded", "Q5_K", all(GgmlType::Q5_K), 0.96, 0.7},
                                           Case{"qwen35moe-text-per-expert", "Q6_K", all(GgmlType::Q6_K), 0.985, 0.95},
                                           Case{"qwen3next-sharded", "Q6_K", all(GgmlType::Q6_K), 0.985, 0.95},
                                           Case{"qwen35moe-text-per-expert", "Q8_0", all(GgmlType::Q8_0), 0.998, 0.985},
                                           Case{"qwen3next-sharded", "Q8_0", all(GgmlType::Q8_0), 0.998, 0.985}),
                         case_name);

// Each encoder's rows decode (by Petrel's gguf-py-exact decoder) to within a fraction of the
// values' spread (measured: 0.080, 0.039, 0.020, 0.0054 for unit variance): a block laid out
// wrongly decodes to other elements' codes and misses by far more.
TEST(GgufKQuantEncode, RowsDecodeNearTheirValues) {
  Normal normal{std::mt19937(7)};
  std::vector<float> x(4096);
  for (float& v : x) v = normal(0.3, 1);
  const std::pair<GgmlType, double> kBounds[] = {
      {GgmlType::Q4_K, 0.12}, {GgmlType::Q5_K, 0.06}, {GgmlType::Q6_K, 0.03}, {GgmlType::Q8_0, 0.008}};
  for (const auto& [type, bound] : kBounds) {
    const std::vector<uint8_t> b = test::ggml_encode(type, x.data(), int64_t(x.size()));
    ASSERT_EQ(int64_t(b.size()), ggml_row_bytes(type, int64_t(x.size())));
    std::vector<float> y(x.size());
    ggml_dequantize_row(type, b.data(), int64_t(x.size()), y.data());
    double err = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (x[i] - y[i]) * (x[i] - y[i]);
    EXPECT_LE(std::sqrt(err / double(x.size())), bound) << ggml_type_name(type);
  }
}

}  // namespace
}  // namespace petrel
