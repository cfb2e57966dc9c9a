#include "model/step_ops.h"

namespace petrel {
namespace {

// Writes ops into a list, with the step's buffers cut to its rows.
class StepWriter {
 public:
  StepWriter(const ModelConfig& c, const ModelWeights& w, const StepBuffers& b, const StepShape& s)
      : c_(c), w_(w), s_(s) {
    const int64_t T = s.rows;
    for (auto [dst, src] : {std::pair{&b_.h, &b.h}, {&b_.x, &b.x}, {&b_.mix, &b.mix}, {&b_.ffn, &b.ffn},
                            {&b_.q, &b.q}, {&b_.gate, &b.gate}, {&b_.k, &b.k}, {&b_.v, &b.v}, {&b_.attn, &b.attn},
                            {&b_.qkv, &b.qkv}, {&b_.z, &b.z}, {&b_.b, &b.b}, {&b_.a, &b.a}, {&b_.gdn, &b.gdn}})
      if (src->data) *dst = src->rows_view(0, T);
  }

  OpList write() {
    // A layer writes at most 12 ops, and a row more for each DeltaNet row taken alone.
    ops_.reserve(size_t(c_.n_layers) * (12 + size_t(s_.rows_one_at_a_time ? s_.rows : 0)) + 4);
    ops_.push_back(op::Embed{&w_.embed, b_.h});
    for (int i = 0; i < c_.n_layers; ++i) layer(w_.layers[i], i);
    head(w_.final_norm);
    return std::move(ops_);
  }

  // The MTP step, with b_.h already the head's own residual stream.
  OpList write_mtp(const MtpBuffers& m, const MtpInput& in) {
    const int64_t T = s_.rows, H = c_.hidden;
    const MtpWeights& M = w_.mtp;
    const Tensor cat = m.concat.rows_view(0, T);
    ops_.reserve(M.layers.size() * 12 + 9);
    ops_.push_back(op::Embed{&w_.embed, b_.x});
    ops_.push_back(op::RmsNorm{b_.x, &M.embed_norm, c_.rms_eps, cat.cols_view(0, H)});
    ops_.push_back(op::RmsNorm{in.hidden.rows_view(0, T), in.norm, c_.rms_eps, b_.x});
    ops_.push_back(op::RmsNorm{b_.x, &M.hidden_norm, c_.rms_eps, cat.cols_view(H, H)});
    ops_.push_back(op::Linear{cat, &M.fc, b_.h});
    for (size_t j = 0; j < M.layers.size(); ++j) layer(M.layers[j], c_.n_layers + int(j));
    head(M.norm);
    return std::move(ops_);
  }

 private:
  // The logits rows the shape asks for: rms_norm(h)·norm, then the LM head (and its argmax).
  void head(const std::vector<float>& norm) {
    const int64_t n = s_.logits.rows;
    if (n == 0) return;
    const int64_t first = s_.rows - n;
    Tensor x = b_.x.rows_view(first, n);
    if (s_.logit_rows.empty()) {
      ops_.push_back(op::RmsNorm{b_.h.rows_view(first, n), &norm, c_.rms_eps, x});
    } else {  // the rows asked for, normed into x's first rows: a norm for each run of neighbours
      const std::vector<int>& r = s_.logit_rows;
      x = b_.x.rows_view(0, n);
      for (size_t i = 0; i < r.size();) {
        size_t j = i + 1;
        while (j < r.size() && r[j] == r[j - 1] + 1) ++j;
        const auto run = int64_t(j - i);
        ops_.push_back(op::RmsNorm{b_.h.rows_view(r[i], run), &norm, c_.rms_eps, x.rows_view(int64_t(i), run)});
        i = j;
      }
    }
    ops_.push_back(op::Linear{x, &w_.lm_head, s_.logits});
    if (s_.argmax) ops_.push_back(op::Argmax{s_.logits.rows_view(n - 1, 1)});
  }

  // h += mixer(rms_norm(h)·input_norm) · outᵀ, then h += ffn(rms_norm(h)·post_norm). `i` is the
  // layer's cache index in the sequence state.
  void layer(const LayerWeights& L, int i) {
    ops_.push_back(op::RmsNorm{b_.h, &L.input_norm, c_.rms_eps, b_.x});
    if (L.kind == LayerKind::DeltaNet) deltanet(i, L.gdn);
    else attention(i, L.attn);
    ops_.push_back(op::Add{b_.h, b_.mix});
    ops_.push_back(op::RmsNorm{b_.h, &L.post_norm, c_.rms_eps, b_.x});
    if (L.ffn.moe) ops_.push_back(op::Moe{b_.x, &L.ffn, b_.ffn});
    else ops_.push_back(op::Mlp{b_.x, &L.ffn.dense, b_.ffn});
    ops_.push_back(op::Add{b_.h, b_.ffn});
  }

  void attention(int i, const AttentionWeights& A) {
    ops_.push_back(op::Linear{b_.x, &A.q, b_.q});
    ops_.push_back(op::Linear{b_.x, &A.k, b_.k});
    ops_.push_back(op::Linear{b_.x, &A.v, b_.v});
    const Tensor gate = A.gate.valid() ? b_.gate : Tensor{};
    if (A.gate.valid()) ops_.push_back(op::Linear{b_.x, &A.gate, gate});
    ops_.push_back(op::QkNormRope{b_.q, b_.k, &A});
    ops_.push_back(op::Attention{b_.q, b_.k, b_.v, gate, i, s_.states, b_.attn});
    ops_.push_back(op::Linear{b_.attn, &A.o, b_.mix});
  }

  void deltanet(int i, const DeltaNetWeights& G) {
    ops_.push_back(op::Linear{b_.x, &G.qkv, b_.qkv});
    ops_.push_back(op::Linear{b_.x, &G.z, b_.z});
    ops_.push_back(op::Linear{b_.x, &G.b, b_.b});
    ops_.push_back(op::Linear{b_.x, &G.a, b_.a});
    if (!s_.rows_one_at_a_time) {
      ops_.push_back(op::DeltaNet{b_.qkv, b_.z, b_.b, b_.a, &G, i, s_.states, b_.gdn});
    } else {
      for (int64_t t = 0; t < s_.rows; ++t)
        ops_.push_back(op::DeltaNet{b_.qkv.rows_view(t, 1), b_.z.rows_view(t, 1), b_.b.rows_view(t, 1),
                                    b_.a.rows_view(t, 1), &G, i, s_.states, b_.gdn.rows_view(t, 1)});
    }
    ops_.push_back(op::Linear{b_.gdn, &G.out, b_.mix});
  }

  const ModelConfig& c_;
  const ModelWeights& w_;
  const StepShape& s_;
  StepBuffers b_;
  OpList ops_;
};

}  // namespace

OpList step_ops(const ModelConfig& config, const ModelWeights& weights, const StepBuffers& buffers,
                const StepShape& shape) {
  return StepWriter(config, weights, buffers, shape).write();
}

OpList mtp_step_ops(const ModelConfig& config, const ModelWeights& weights, const StepBuffers& buffers,
                    const MtpBuffers& mtp, const MtpInput& input, const StepShape& shape) {
  StepBuffers b = buffers;
  b.h = mtp.h;
  return StepWriter(config, weights, b, shape).write_mtp(mtp, input);
}

}  // namespace petrel
