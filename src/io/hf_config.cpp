#include "io/hf_config.h"

#include <cmath>
#include <fstream>
#include <set>

#include "core/error.h"
#include "io/json_file.h"

namespace petrel {
namespace {

using json = nlohmann::json;

// Field access with errors that name the file, the field and what was expected.
struct Fields {
  const json& j;
  const std::string& path;
  std::string scope;  // "" or "text_config."

  bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
  std::string name(const char* k) const { return path + ": field '" + scope + k + "'"; }
  // An integer in [lo, hi] (0 <= lo): bounds keep absurd sizes (10^12 layers, a hidden size of 0) out of the
  // arithmetic and allocations that follow.
  int integer(const char* k, int lo, int hi) const {
    const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    check(has(k), name(k) + " is missing (expected " + range + ")");
    const json& v = j[k];
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() >= uint64_t(lo) && v.get<uint64_t>() <= uint64_t(hi)
                              : v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    check(in_range, name(k) + " must be " + range + ", found " + v.dump());
    return v.get<int>();
  }
  int integer_or(const char* k, int fallback, int lo, int hi) const { return has(k) ? integer(k, lo, hi) : fallback; }
  double number_or(const char* k, double fallback) const {
    if (!has(k)) return fallback;
    check(j[k].is_number(), name(k) + " must be a number, found " + j[k].dump());
    return j[k].get<double>();
  }
  bool boolean_or(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    check(j[k].is_boolean(), name(k) + " must be true or false, found " + j[k].dump());
    return j[k].get<bool>();
  }
  std::string string_or(const char* k, const std::string& fallback) const {
    if (!has(k)) return fallback;
    check(j[k].is_string(), name(k) + " must be a string, found " + j[k].dump());
    return j[k].get<std::string>();
  }
};

Arch parse_arch(const std::string& model_type, const std::string& path) {
  if (model_type == "qwen3_5_moe" || model_type == "qwen3_5_moe_text") return Arch::Qwen3_5Moe;
  if (model_type == "qwen3_5" || model_type == "qwen3_5_text") return Arch::Qwen3_5;
  if (model_type == "qwen3_next") return Arch::Qwen3Next;
  if (model_type == "qwen3_moe") return Arch::Qwen3Moe;
  if (model_type == "qwen3") return Arch::Qwen3;
  throw Error(path + ": unknown architecture: model_type '" + model_type +
              "' (supported: qwen3_5_moe, qwen3_5, qwen3_next, qwen3_moe, qwen3)");
}

void parse_rope(const Fields& f, ModelConfig& c) {
  double theta = f.number_or("rope_theta", 10000.0);
  double partial = f.number_or("partial_rotary_factor", 1.0);
  if (f.has("rope_parameters")) {
    const json& rp = f.j["rope_parameters"];
    check(rp.is_object(), f.path + ": field '" + f.scope + "rope_parameters' must be an object");
    Fields r{rp, f.path, f.scope + "rope_parameters."};
    theta = r.number_or("rope_theta", theta);
    partial = r.number_or("partial_rotary_factor", partial);
    const std::string type = r.string_or("rope_type", "default");
    check(type == "default", f.path + ": rope_parameters.rope_type '" + type + "' is not supported (expected 'default')");
  }
  if (f.has("rope_scaling")) {
    const json& rs = f.j["rope_scaling"];
    check(rs.is_object(), f.name("rope_scaling") + " must be an object, found " + rs.dump());
    Fields s{rs, f.path, f.scope + "rope_scaling."};
    const std::string type = s.string_or("rope_type", s.string_or("type", "default"));
    check(type == "default" || type == "mrope",
          f.path + ": rope_scaling type '" + type + "' is not supported (expected none or 'default')");
  }
  check(std::isfinite(theta) && theta > 0, f.path + ": rope_theta must be a positive number, found " +
                                               std::to_string(theta));
  check(partial > 0 && partial <= 1, f.path + ": partial_rotary_factor must be in (0, 1], found " +
                                         std::to_string(partial));
  c.rope_theta = float(theta);
  c.rotary_dim = int(c.head_dim * partial);
  check(c.rotary_dim > 0 && c.rotary_dim <= c.head_dim && c.rotary_dim % 2 == 0,
        f.path + ": partial_rotary_factor " + std::to_string(partial) + " gives rotary dim " +
            std::to_string(c.rotary_dim) + " for head_dim " + std::to_string(c.head_dim) +
            " (expected an even number in 2.." + std::to_string(c.head_dim) + ")");
}

void parse_layer_kinds(const Fields& f, ModelConfig& c) {
  c.layer_kinds.assign(c.n_layers, LayerKind::FullAttention);
  if (c.arch == Arch::Qwen3 || c.arch == Arch::Qwen3Moe) return;
  if (f.has("layer_types")) {
    const json& lt = f.j["layer_types"];
    check(lt.is_array() && int(lt.size()) == c.n_layers,
          f.path + ": field 'layer_types' must list " + std::to_string(c.n_layers) + " entries (num_hidden_layers)");
    for (int i = 0; i < c.n_layers; ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : lt[i].dump();
      if (t == "linear_attention") c.layer_kinds[i] = LayerKind::DeltaNet;
      else check(t == "full_attention", f.path + ": layer_types[" + std::to_string(i) + "] is '" + t +
                                            "' (expected 'linear_attention' or 'full_attention')");
    }
    return;
  }
  const int interval = f.integer_or("full_attention_interval", 4, 1, limits::kLayers);
  for (int i = 0; i < c.n_layers; ++i)
    c.layer_kinds[i] = ((i + 1) % interval == 0) ? LayerKind::FullAttention : LayerKind::DeltaNet;
}

void parse_ffn(const Fields& f, ModelConfig& c) {
  c.layer_is_moe.assign(c.n_layers, false);
  if (c.arch == Arch::Qwen3 || c.arch == Arch::Qwen3_5) {
    c.intermediate = f.integer("intermediate_size", 1, limits::kIntermediate);
    return;
  }
  // Released configs say num_experts; transformers 5 writes Qwen3-MoE's as num_local_experts.
  const char* experts = f.has("num_experts") || !f.has("num_local_experts") ? "num_experts" : "num_local_experts";
  c.n_experts = f.integer(experts, 1, limits::kExperts);
  c.top_k = f.integer("num_experts_per_tok", 1, c.n_experts);
  c.moe_intermediate = f.integer("moe_intermediate_size", 1, limits::kIntermediate);
  if (c.arch != Arch::Qwen3Moe)
    c.shared_intermediate = f.integer("shared_expert_intermediate_size", 0, limits::kIntermediate);
  if (c.arch == Arch::Qwen3_5Moe) {
    c.norm_topk_prob = true;  // HF's Qwen3.5 router always renormalises
    c.layer_is_moe.assign(c.n_layers, true);
    return;
  }
  c.norm_topk_prob = f.boolean_or("norm_topk_prob", c.arch == Arch::Qwen3Next);
  c.intermediate = f.integer_or("intermediate_size", 0, 0, limits::kIntermediate);
  const int step = f.integer_or("decoder_sparse_step", 1, 0, limits::kLayers);
  std::set<int64_t> mlp_only;
  if (f.has("mlp_only_layers")) {
    const json& layers = f.j["mlp_only_layers"];
    check(layers.is_array(), f.name("mlp_only_layers") + " must be an array of layer indices, found " + layers.dump());
    for (const auto& v : layers) {
      check(v.is_number_integer(), f.name("mlp_only_layers") + " must hold layer indices, found " + v.dump());
      mlp_only.insert(v.get<int64_t>());
    }
  }
  for (int i = 0; i < c.n_layers; ++i)
    c.layer_is_moe[i] = !mlp_only.count(i) && step > 0 && (i + 1) % step == 0;
  for (int i = 0; i < c.n_layers; ++i)
    check(c.layer_is_moe[i] || c.intermediate > 0,
          f.path + ": layer " + std::to_string(i) + " is a dense MLP layer but 'intermediate_size' is missing");
}

void parse_eos(const json& j, ModelConfig& c) {
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return;
  const json& e = j["eos_token_id"];
  if (e.is_number_integer()) c.eos_ids.push_back(e.get<int>());
  else if (e.is_array())
    for (const auto& v : e)
      if (v.is_number_integer()) c.eos_ids.push_back(v.get<int>());
}

}  // namespace

ModelConfig parse_hf_config(const json& root, const std::string& path) {
  check(root.is_object(), path + ": expected a JSON object");
  check(root.contains("model_type") && root["model_type"].is_string(),
        path + ": field 'model_type' is missing (expected e.g. \"qwen3_5_moe\")");
  ModelConfig c;
  c.arch = parse_arch(root["model_type"].get<std::string>(), path);
  const bool wrapped = root.contains("text_config") && root["text_config"].is_object();
  const json& tj = wrapped ? root["text_config"] : root;
  Fields f{tj, path, wrapped ? "text_config." : ""};

  c.vocab = f.integer("vocab_size", 1, limits::kVocab);
  c.hidden = f.integer("hidden_size", 1, limits::kHidden);
  c.n_layers = f.integer("num_hidden_layers", 1, limits::kLayers);
  c.n_heads = f.integer("num_attention_heads", 1, limits::kHeads);
  c.n_kv_heads = f.integer_or("num_key_value_heads", c.n_heads, 1, limits::kHeads);
  c.head_dim = f.integer_or("head_dim", c.hidden / c.n_heads, 1, limits::kHeadDim);
  check(c.head_dim > 0, path + ": head_dim is missing and hidden_size " + std::to_string(c.hidden) +
                            " / num_attention_heads " + std::to_string(c.n_heads) + " gives 0");
  check(c.n_heads % c.n_kv_heads == 0, path + ": num_attention_heads " + std::to_string(c.n_heads) +
                                           " is not a multiple of num_key_value_heads " + std::to_string(c.n_kv_heads));
  const double eps = f.number_or("rms_norm_eps", 1e-6);
  check(eps > 0 && eps < 1, f.name("rms_norm_eps") + " must be in (0, 1), found " + std::to_string(eps));
  c.rms_eps = float(eps);
  c.max_position = f.integer_or("max_position_embeddings", 32768, 1, limits::kPositions);
  c.tie_embeddings = Fields{root, path, ""}.boolean_or("tie_word_embeddings", f.boolean_or("tie_word_embeddings", false));
  c.attn_output_gate = c.arch == Arch::Qwen3_5Moe || c.arch == Arch::Qwen3_5 || c.arch == Arch::Qwen3Next;
  parse_rope(f, c);
  parse_layer_kinds(f, c);
  if (c.arch == Arch::Qwen3_5Moe || c.arch == Arch::Qwen3_5 || c.arch == Arch::Qwen3Next) {
    c.lin_k_heads = f.integer("linear_num_key_heads", 1, limits::kHeads);
    c.lin_v_heads = f.integer("linear_num_value_heads", 1, limits::kHeads);
    c.lin_k_dim = f.integer("linear_key_head_dim", 1, limits::kHeadDim);
    c.lin_v_dim = f.integer("linear_value_head_dim", 1, limits::kHeadDim);
    c.conv_kernel = f.integer_or("linear_conv_kernel_dim", 4, 1, limits::kConvKernel);
    check(c.lin_v_heads % c.lin_k_heads == 0,
          path + ": linear_num_value_heads " + std::to_string(c.lin_v_heads) +
              " is not a multiple of linear_num_key_heads " + std::to_string(c.lin_k_heads));
  }
  parse_ffn(f, c);
  c.mtp_layers = f.integer_or("mtp_num_hidden_layers", 0, 0, limits::kLayers);
  parse_eos(root, c);
  if (c.eos_ids.empty()) parse_eos(tj, c);
  return c;
}

json read_hf_config_json(const std::string& config_json_path) {
  std::ifstream in(config_json_path);
  check(bool(in), config_json_path + ": cannot open (a checkpoint folder needs config.json)");
  return parse_checkpoint_json(config_json_path, in);
}

}  // namespace petrel
