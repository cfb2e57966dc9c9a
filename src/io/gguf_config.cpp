#include "io/gguf_config.h"

#include <cmath>

#include "core/error.h"

namespace petrel {
namespace {

// Typed reads of "{arch}.NAME" keys, bounded like parse_hf_config's fields.
struct Keys {
  const GgufMetadata& md;
  std::string arch;

  std::string key(const std::string& name) const { return arch + "." + name; }
  int integer(const std::string& name, int lo, int hi) const {
    const std::string k = key(name);
    const uint64_t v = md.get_uint(k);
    check(v >= uint64_t(lo) && v <= uint64_t(hi), md.file() + ": metadata key '" + k + "' is " + std::to_string(v) +
                                                      ", expected an integer in [" + std::to_string(lo) + ", " +
                                                      std::to_string(hi) + "]");
    return int(v);
  }
  int integer_or(const std::string& name, int fallback, int lo, int hi) const {
    return md.has(key(name)) ? integer(name, lo, hi) : fallback;
  }
  double number_or(const std::string& name, double fallback) const {
    return md.has(key(name)) ? md.get_float(key(name)) : fallback;
  }
};

// general.architecture as Petrel's Arch.
Arch parse_arch(const GgufMetadata& md) {
  const std::string a = md.get_string("general.architecture");
  if (a == "qwen3") return Arch::Qwen3;
  if (a == "qwen3moe") return Arch::Qwen3Moe;
  if (a == "qwen35moe") return Arch::Qwen3_5Moe;
  if (a == "qwen35") return Arch::Qwen3_5;
  if (a == "qwen3next") return Arch::Qwen3Next;
  throw Error(md.file() + ": unknown GGUF architecture '" + a +
              "' (metadata general.architecture; Petrel reads qwen3, qwen3moe, qwen35, qwen35moe and qwen3next)");
}

// The Gated DeltaNet sizes: Qwen3NextModel.set_gguf_parameters writes linear_key_head_dim as
// ssm.state_size, the key heads as ssm.group_count, the value heads as ssm.time_step_rank and
// value heads x value head dim as ssm.inner_size. Which layers are recurrent is read from the
// tensors instead of {arch}.full_attention_interval: the converter writes that key from
// config.json's full_attention_interval, defaulting to 4 when the config lists only layer_types.
void parse_deltanet(const Keys& k, const GgufModel& model, ModelConfig& c) {
  const std::string& file = k.md.file();
  c.lin_k_heads = k.integer("ssm.group_count", 1, limits::kHeads);
  c.lin_v_heads = k.integer("ssm.time_step_rank", 1, limits::kHeads);
  c.lin_k_dim = k.integer("ssm.state_size", 1, limits::kHeadDim);
  c.conv_kernel = k.integer("ssm.conv_kernel", 1, limits::kConvKernel);
  const int inner = k.integer("ssm.inner_size", 1, limits::kHeads * limits::kHeadDim);
  check(inner % c.lin_v_heads == 0 && inner / c.lin_v_heads <= limits::kHeadDim,
        file + ": " + k.key("ssm.inner_size") + " " + std::to_string(inner) + " is not a multiple of " +
            k.key("ssm.time_step_rank") + " " + std::to_string(c.lin_v_heads) + " (value heads) up to " +
            std::to_string(limits::kHeadDim) + " values each");
  c.lin_v_dim = inner / c.lin_v_heads;
  check(c.lin_v_heads % c.lin_k_heads == 0, file + ": " + k.key("ssm.time_step_rank") + " " +
                                                std::to_string(c.lin_v_heads) + " is not a multiple of " +
                                                k.key("ssm.group_count") + " " + std::to_string(c.lin_k_heads));
  for (int i = 0; i < c.n_layers; ++i)
    if (model.find("blk." + std::to_string(i) + ".ssm_conv1d.weight")) c.layer_kinds[i] = LayerKind::DeltaNet;
}

}  // namespace

ModelConfig parse_gguf_config(const GgufModel& model) {
  const GgufMetadata& md = model.metadata();
  const std::string& file = md.file();
  ModelConfig c;
  c.arch = parse_arch(md);
  const Keys k{md, md.get_string("general.architecture")};
  const bool hybrid = c.arch == Arch::Qwen3_5Moe || c.arch == Arch::Qwen3_5 || c.arch == Arch::Qwen3Next;

  // The converter pads tokenizer.ggml.tokens to config.json's vocab_size; {arch}.vocab_size is
  // written only by converters for models whose vocabulary differs from the token list.
  if (md.has(k.key("vocab_size"))) {
    c.vocab = k.integer("vocab_size", 1, limits::kVocab);
  } else {
    const GgufValue* tokens = md.find("tokenizer.ggml.tokens");
    check(tokens != nullptr, file + ": metadata has neither '" + k.key("vocab_size") +
                                 "' nor 'tokenizer.ggml.tokens', so the vocabulary size is unknown");
    check(tokens->size() >= 1 && tokens->size() <= size_t(limits::kVocab),
          file + ": metadata key 'tokenizer.ggml.tokens' lists " + std::to_string(tokens->size()) +
              " tokens, expected 1 to " + std::to_string(limits::kVocab));
    c.vocab = int(tokens->size());
  }
  c.hidden = k.integer("embedding_length", 1, limits::kHidden);
  // _Qwen35MtpMixin counts the multi-token-prediction block(s) in block_count and names them in
  // nextn_predict_layers; they come after the trunk's layers (gguf_weights.cpp maps them).
  const int blocks = k.integer("block_count", 1, limits::kLayers);
  c.mtp_layers = k.integer_or("nextn_predict_layers", 0, 0, blocks - 1);
  check(c.mtp_layers <= 1, file + ": metadata key '" + k.key("nextn_predict_layers") + "' is " +
                               std::to_string(c.mtp_layers) +
                               ": multi-token prediction heads of more than one layer are not supported");
  c.n_layers = blocks - c.mtp_layers;
  c.n_heads = k.integer("attention.head_count", 1, limits::kHeads);
  c.n_kv_heads = k.integer_or("attention.head_count_kv", c.n_heads, 1, limits::kHeads);
  // llama.cpp's default head size is embedding_length / head_count when key_length is absent.
  c.head_dim = k.integer_or("attention.key_length", c.hidden / c.n_heads, 1, limits::kHeadDim);
  check(c.head_dim > 0, file + ": metadata key '" + k.key("attention.key_length") + "' is missing and " +
                            k.key("embedding_length") + " / " + k.key("attention.head_count") + " gives 0");
  const int value_length = k.integer_or("attention.value_length", c.head_dim, 1, limits::kHeadDim);
  check(value_length == c.head_dim, file + ": metadata key '" + k.key("attention.value_length") + "' is " +
                                        std::to_string(value_length) + ", expected the key length " +
                                        std::to_string(c.head_dim));
  check(c.n_heads % c.n_kv_heads == 0, file + ": " + k.key("attention.head_count") + " " + std::to_string(c.n_heads) +
                                           " is not a multiple of " + k.key("attention.head_count_kv") + " " +
                                           std::to_string(c.n_kv_heads));
  const double eps = k.number_or("attention.layer_norm_rms_epsilon", 1e-6);
  check(eps > 0 && eps < 1, file + ": metadata key '" + k.key("attention.layer_norm_rms_epsilon") + "' is " +
                                std::to_string(eps) + ", expected a number in (0, 1)");
  c.rms_eps = float(eps);
  c.max_position = k.integer_or("context_length", 32768, 1, limits::kPositions);

  const double theta = k.number_or("rope.freq_base", 10000.0);
  check(std::isfinite(theta) && theta > 0, file + ": metadata key '" + k.key("rope.freq_base") + "' is " +
                                               std::to_string(theta) + ", expected a positive number");
  c.rope_theta = float(theta);
  if (md.has(k.key("rope.scaling.type"))) {
    const std::string scaling = md.get_string(k.key("rope.scaling.type"));
    check(scaling == "none", file + ": metadata key '" + k.key("rope.scaling.type") + "' is '" + scaling +
                                 "', which Petrel does not support (expected none)");
  }
  c.rotary_dim = k.integer_or("rope.dimension_count", c.head_dim, 2, c.head_dim);
  check(c.rotary_dim % 2 == 0, file + ": metadata key '" + k.key("rope.dimension_count") + "' is " +
                                   std::to_string(c.rotary_dim) + ", expected an even number");
  c.layer_kinds.assign(c.n_layers, LayerKind::FullAttention);
  // The converter writes lm_head as output.weight unless config.json ties it to the embedding.
  c.tie_embeddings = model.find("output.weight") == nullptr;
  if (hybrid) {
    c.attn_output_gate = true;  // every Qwen3-Next / Qwen3.5 attention layer has the sigmoid gate
    parse_deltanet(k, model, c);
  }

  c.layer_is_moe.assign(c.n_layers, false);
  if (c.arch == Arch::Qwen3Moe || c.arch == Arch::Qwen3_5Moe || c.arch == Arch::Qwen3Next) {
    c.n_experts = k.integer("expert_count", 1, limits::kExperts);
    c.top_k = k.integer("expert_used_count", 1, c.n_experts);
    c.moe_intermediate = k.integer("expert_feed_forward_length", 1, limits::kIntermediate);
    c.shared_intermediate = k.integer_or("expert_shared_feed_forward_length", 0, 0, limits::kIntermediate);
    // No key carries norm_topk_prob: llama.cpp's MoE graphs for these architectures always
    // renormalise the top-k weights, as every released config asks.
    c.norm_topk_prob = true;
    // Every layer of a converted Qwen3-MoE is sparse (the converter has no names for
    // mlp_only_layers' dense MLPs); a file that stores a layer's dense MLP under ffn_gate/up/down
    // and no router is read as that dense layer.
    for (int i = 0; i < c.n_layers; ++i)
      c.layer_is_moe[i] = model.find("blk." + std::to_string(i) + ".ffn_gate_inp.weight") != nullptr;
  }
  bool any_dense = false;
  for (int i = 0; i < c.n_layers; ++i) any_dense = any_dense || !c.layer_is_moe[i];
  if (any_dense) c.intermediate = k.integer("feed_forward_length", 1, limits::kIntermediate);

  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!md.has(key)) continue;
    const uint64_t id = md.get_uint(key);
    check(id < uint64_t(c.vocab), file + ": metadata key '" + key + "' is " + std::to_string(id) +
                                      ", outside the vocabulary of " + std::to_string(c.vocab) + " tokens");
    if (c.eos_ids.empty() || c.eos_ids[0] != int(id)) c.eos_ids.push_back(int(id));
  }
  return c;
}

}  // namespace petrel
