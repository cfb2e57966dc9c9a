// The CPU backend: fp32 compute, OpenMP threads, weights read in place (bf16 / MLX codes decoded
// per row block). It is the numerical reference every other backend is tested against.
#pragma once
#include <deque>
#include <vector>

#include "backend/backend.h"

namespace petrel {

struct CpuOptions {
  int threads = 0;  // 0: all cores
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options = {});
  std::string name() const override { return "cpu"; }

  void prepare(const ModelConfig& config, const ModelWeights& weights) override;
  Tensor alloc(int64_t rows, int64_t cols, bool fp32 = false) override;
  std::unique_ptr<SequenceState> new_sequence(int capacity) override;
  // States live in host memory already.
  std::unique_ptr<SequenceState> new_host_sequence(int capacity) override { return new_sequence(capacity); }
  std::unique_ptr<SequenceState> new_mtp_sequence(int capacity) override;
  void to_host(const Tensor& t, float* dst) override;
  void from_host(const float* src, Tensor t) override;
  void begin_forward(const int32_t* ids, int n, const SequenceState& st) override;
  void begin_batch(const int32_t* ids, SequenceState* const* seqs, int B, const StepPiece* pieces,
                   int n_pieces) override;
  void argmax(const Tensor& logits) override;
  int32_t greedy_token() override { return greedy_; }

  void embed(const Matrix& table, Tensor out) override;
  void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor out) override;
  void linear(const Tensor& x, const Matrix& w, Tensor out) override;
  void add(Tensor h, const Tensor& a) override;
  void qk_norm_rope(Tensor q, Tensor k, const AttentionWeights& w) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                 SequenceState& st, Tensor out) override;
  void deltanet(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a, const DeltaNetWeights& w,
                int layer, SequenceState& st, Tensor out) override;
  void mlp(const Tensor& x, const MlpWeights& w, Tensor out) override;
  void moe(const Tensor& x, const FfnWeights& w, Tensor out) override;
  void release_calling_thread() override;

 private:
  void use_threads() const;

  int threads_;
  ModelConfig config_;
  std::deque<std::vector<float>> buffers_;
  std::vector<int32_t> ids_;        // staged by begin_forward / begin_batch
  std::vector<int> positions_;      // of each staged row
  int32_t greedy_ = -1;             // the last queued argmax
};

}  // namespace petrel
