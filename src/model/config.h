// ModelConfig: every number the forward pass needs, independent of the checkpoint format.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace petrel {

enum class Arch { Qwen3_5Moe, Qwen3_5, Qwen3Next, Qwen3Moe, Qwen3 };
enum class LayerKind { FullAttention, DeltaNet };

const char* arch_name(Arch a);

// Upper bounds of config sizes: far above any released model's, low enough that the sizes a
// loader derives from them (heads x head dim, DeltaNet conv channels) fit in an int.
namespace limits {
constexpr int kVocab = 1 << 24;
constexpr int kHidden = 1 << 16;
constexpr int kLayers = 1 << 12;
constexpr int kHeads = 1 << 12;
constexpr int kHeadDim = 1 << 12;
constexpr int kIntermediate = 1 << 20;
constexpr int kExperts = 1 << 14;
constexpr int kConvKernel = 1 << 10;
constexpr int kPositions = 1 << 30;
}  // namespace limits

struct ModelConfig {
  Arch arch = Arch::Qwen3;
  int vocab = 0;
  int hidden = 0;
  int n_layers = 0;
  std::vector<LayerKind> layer_kinds;
  std::vector<bool> layer_is_moe;  // false: dense SwiGLU MLP of `intermediate` width
  float rms_eps = 1e-6f;
  bool tie_embeddings = false;
  int max_position = 0;

  // Full attention.
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool attn_output_gate = false;  // Qwen3-Next / Qwen3.5: q_proj also yields a sigmoid gate per head
  int rotary_dim = 0;             // partial NeoX rotary on the first rotary_dim dims of each head
  float rope_theta = 10000.0f;

  // Gated DeltaNet.
  int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, conv_kernel = 0;

  // Feed-forward.
  int intermediate = 0;  // dense MLP width
  int n_experts = 0, top_k = 0, moe_intermediate = 0, shared_intermediate = 0;
  bool norm_topk_prob = true;

  std::vector<int> eos_ids;

  // Multi-token prediction: full-attention decoder layers of the checkpoint's draft head
  // (model/weights.h MtpWeights); 0 when the checkpoint has none.
  int mtp_layers = 0;

  bool hybrid() const { return lin_v_heads > 0; }
  int gdn_key_dim() const { return lin_k_heads * lin_k_dim; }
  int gdn_value_dim() const { return lin_v_heads * lin_v_dim; }
  int gdn_conv_channels() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  int count(LayerKind k) const;
};

}  // namespace petrel
