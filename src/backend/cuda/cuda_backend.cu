#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_sampler.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/op_groups.h"
#include "backend/cuda/op_timer.h"
#include "core/progress.h"

namespace petrel {
namespace {

using cuda::bf16;
using cuda::DeviceMatrix;

// Caches and recurrent state of one sequence on the device, indexed by layer; or, `host`, in
// pinned host memory, a copy held off the device that only copy_from reads and writes. Each kind
// of state is one allocation, its layers stacked, so that a copy of the whole sequence (every
// verify step of speculative decoding, every snapshot and restore of the prefix cache) is a
// handful of copies rather than one per layer and kind.
class CudaSequence final : public SequenceState {
 public:
  CudaSequence(cudaStream_t s, bool host = false) : stream_(s), host_(host) {}
  ~CudaSequence() override {
    for (auto& [key, step] : recorded)
      if (step.exec) cudaGraphExecDestroy(step.exec);
    if (host_) cudaStreamSynchronize(stream_);  // a queued copy may still read or write the pages
    for (const Region& r : regions_) host_ ? cudaFreeHost(r.p) : cudaFree(r.p);
  }

  // `layers` zeroed blocks of `per_layer` elements, each 256-byte aligned as an allocation of its
  // own would be; each block's start. row_bytes > 0 marks KV caches: only the first n_past rows of
  // each block hold data worth copying.
  template <typename T>
  std::vector<T*> alloc(int layers, size_t per_layer, size_t row_bytes = 0) {
    const size_t layer_bytes = (per_layer * sizeof(T) + 255) / 256 * 256;
    Region r{nullptr, size_t(layers) * layer_bytes, layer_bytes, row_bytes, layers};
    if (host_) {
      PETREL_CUDA(cudaMallocHost(&r.p, r.bytes));
      std::memset(r.p, 0, r.bytes);
    } else {
      PETREL_CUDA(cudaMalloc(&r.p, r.bytes));
      PETREL_CUDA(cudaMemsetAsync(r.p, 0, r.bytes, stream_));
    }
    regions_.push_back(r);
    std::vector<T*> blocks;
    for (int i = 0; i < layers; ++i) blocks.push_back(reinterpret_cast<T*>(static_cast<char*>(r.p) + i * layer_bytes));
    return blocks;
  }

  // Speculative rollback copies states every verify step, and a prefix cache snapshots and restores
  // them: KV caches only up to n_past (one strided copy for all their layers), so the two may differ
  // in capacity. Unified addressing lets one call copy device to device, and to and from a host state.
  void copy_from(const SequenceState& other) override {
    const auto& o = dynamic_cast<const CudaSequence&>(other);
    bool same = o.regions_.size() == regions_.size();
    for (size_t i = 0; same && i < regions_.size(); ++i)
      same = o.regions_[i].row_bytes == regions_[i].row_bytes && o.regions_[i].layers == regions_[i].layers &&
             (regions_[i].row_bytes || o.regions_[i].bytes == regions_[i].bytes);
    check(same, "copy_from: sequences of different models");
    check(o.n_past <= capacity, "copy_from: " + std::to_string(o.n_past) + " tokens exceed the capacity of " +
                                    std::to_string(capacity));
    for (size_t i = 0; i < regions_.size(); ++i) {
      const Region &d = regions_[i], &src = o.regions_[i];
      if (!d.row_bytes)
        PETREL_CUDA(cudaMemcpyAsync(d.p, src.p, d.bytes, cudaMemcpyDefault, stream_));
      else if (o.n_past > 0)
        PETREL_CUDA(cudaMemcpy2DAsync(d.p, d.layer_bytes, src.p, src.layer_bytes, d.row_bytes * size_t(o.n_past),
                                      size_t(d.layers), cudaMemcpyDefault, stream_));
    }
    n_past = o.n_past;
  }

  size_t bytes() const override {
    size_t n = 0;
    for (const Region& r : regions_) n += r.bytes;
    return n;
  }

  // KV rows past n_past are never read, so only the conv and recurrent states need zeroing.
  void reset() override {
    for (const Region& r : regions_)
      if (!r.row_bytes) PETREL_CUDA(cudaMemsetAsync(r.p, 0, r.bytes, stream_));
    n_past = 0;
  }

  std::vector<bf16*> k, v;        // [capacity, Hkv·D] per attention layer
  std::vector<float*> conv, S;    // [K-1, C] and [Hv, dk, dv] per DeltaNet layer
  // Recorded steps (CudaBackend::run) by row count, variant and the attention path the context
  // takes (CudaBackend::attention_path); `exec` is null until the step's second run records it.
  struct RecordedStep {
    cudaGraphExec_t exec = nullptr;
    bool seen = false;
  };
  std::map<std::tuple<int, int, int>, RecordedStep> recorded;

 private:
  struct Region {
    void* p;
    size_t bytes, layer_bytes, row_bytes;
    int layers;
  };
  cudaStream_t stream_;
  bool host_;
  std::vector<Region> regions_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& o) : opt_(o) {
    PETREL_CUDA(cudaSetDevice(o.device));
    PETREL_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    h_pos_ = alloc_mapped(1, &m_pos_);
    token_ = std::make_unique<cuda::TokenMailbox>();  // after cudaSetDevice: its memory is mapped for that device
    PETREL_CUDA(cudaEventCreateWithFlags(&inputs_read_, cudaEventDisableTiming));
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    for (auto& [rows, g] : batch_graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    weights_.reset();
    for (void* p : allocations_) cudaFree(p);
    if (h_ids_) cudaFreeHost(h_ids_);
    if (h_row_pos_) cudaFreeHost(h_row_pos_);
    if (h_row_states_) cudaFreeHost(h_row_states_);
    cudaFreeHost(h_pos_);
    cudaEventDestroy(inputs_read_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }

  void prepare(const ModelConfig& config, const ModelWeights& weights) override {
    c_ = config;
    cuda::UploadOptions u;
    u.int4 = opt_.weights == DeviceWeights::Int4;
    u.progress = opt_.progress;
    weights_ = std::make_unique<cuda::DeviceWeights>(config, weights, u, stream_);
  }

  void reserve(int max_tokens) override {
    max_tokens_ = max_tokens;
    const ModelConfig& c = c_;
    const int64_t T = max_tokens;
    h_ids_ = alloc_mapped(T, &m_ids_);
    PETREL_CUDA(cudaMallocHost(&h_row_pos_, sizeof(int) * T));
    PETREL_CUDA(cudaMallocHost(&h_row_states_, sizeof(void*) * row_state_slots(int(T))));
    d_ids_ = alloc_raw<int>(T);
    d_pos_ = alloc_raw<int>(1);
    d_row_pos_ = alloc_raw<int>(T);
    d_row_states_ = alloc_raw<void*>(row_state_slots(int(T)));
    argmax_scratch_ = alloc_raw<float>(2 * cuda::kArgmaxCandidates);
    // Records of the split-K attention: the most key ranges (64) for up to 8 rows at a time.
    attn_partial_records_ = std::max<int64_t>(8 * 64, T) * c.n_heads;
    attn_partial_ = alloc_raw<float>(size_t(attn_partial_records_) * (c.head_dim + 2));
    const int64_t cluster_records = cuda::attention_cluster_records(c.n_kv_heads, c.head_dim);
    cluster_records_ = alloc_raw<unsigned long long>(cluster_records);
    PETREL_CUDA(cudaMemsetAsync(cluster_records_, 0xff, cluster_records * sizeof(unsigned long long), stream_));
    if (c.hybrid()) {
      const int64_t C = c.gdn_conv_channels();
      gdn_u_ = alloc_raw<float>(T * C);
      gdn_q_ = alloc_raw<float>(T * c.gdn_key_dim());
      gdn_k_ = alloc_raw<float>(T * c.gdn_key_dim());
      gdn_v_ = alloc_raw<float>(T * c.gdn_value_dim());
      gdn_o_ = alloc_raw<float>(T * c.gdn_value_dim());
      gdn_beta_ = alloc_raw<float>(T * c.lin_v_heads);
      gdn_g_ = alloc_raw<float>(T * c.lin_v_heads);
      gdn_chunks_ = alloc_raw<float>(cuda::delta_rule_chunked_scratch(gdn_shape(), int(T)));
      gdn_readers_ = alloc_raw<int>(T * c.lin_k_heads);
    }
    x_bf16_ = alloc_raw<bf16>(T * ((c.hidden + 7) / 8 * 8));
    const int64_t inter = std::max({c.intermediate, c.moe_intermediate, c.shared_intermediate});
    mlp_g_ = alloc_raw<bf16>(T * inter);
    mlp_u_ = alloc_raw<bf16>(T * inter);
    mlp_act_ = alloc_raw<bf16>(T * inter);
    if (c.n_experts > 0) {
      const int64_t k = c.top_k;
      moe_ids_ = alloc_raw<int>(T * k);
      moe_logits_ = alloc_raw<float>(T * c.n_experts);
      moe_w_ = alloc_raw<float>(T * k);
      moe_sgate_ = alloc_raw<float>(T);
      moe_route_done_ = alloc_raw<int>(T);
      route_sums_ = alloc_raw<unsigned long long>(c.n_experts + 1);
      moe_decode_act_ = alloc_raw<float>(int64_t(cuda::kGemvMaxTokens) * (k + 1) * inter);
      moe_rows_ = cuda::moe_tiles(int(T), int(k), c.n_experts, /*shared=*/true) * cuda::kGemmTileM;
      moe_counts_ = alloc_raw<int>(c.n_experts);
      moe_row_token_ = alloc_raw<int>(moe_rows_);
      moe_slot_row_ = alloc_raw<int>(T * k);
      moe_tile_expert_ = alloc_raw<int>(moe_rows_ / cuda::kGemmTileM);
      moe_g_ = alloc_raw<bf16>(int64_t(moe_rows_) * c.moe_intermediate);
      moe_u_ = alloc_raw<bf16>(int64_t(moe_rows_) * c.moe_intermediate);
      moe_y_ = alloc_raw<bf16>(int64_t(moe_rows_) * c.hidden);
      moe_shared_ = alloc_raw<bf16>(T * c.hidden);
    }
  }

  Tensor alloc(int64_t rows, int64_t cols, bool fp32) override {
    Tensor t;
    t.elem_size = fp32 ? 4 : 2;
    t.rows = rows;
    t.cols = cols;
    t.stride = (cols + 7) / 8 * 8;  // 16-byte aligned rows for vector loads
    t.data = alloc_raw<char>(size_t(rows * t.stride * t.elem_size));
    return t;
  }

  std::unique_ptr<SequenceState> new_sequence(int capacity) override { return make_sequence(capacity, false); }
  std::unique_ptr<SequenceState> new_host_sequence(int capacity) override { return make_sequence(capacity, true); }

  // A host state takes no device memory, so only a device one checks that it fits.
  std::unique_ptr<SequenceState> make_sequence(int capacity, bool host) {
    const ModelConfig& c = c_;
    auto s = std::make_unique<CudaSequence>(stream_, host);
    s->capacity = capacity;
    s->k.assign(c.n_layers, nullptr);
    s->v.assign(c.n_layers, nullptr);
    s->conv.assign(c.n_layers, nullptr);
    s->S.assign(c.n_layers, nullptr);
    const size_t kv = size_t(capacity) * c.n_kv_heads * c.head_dim;
    const size_t need = size_t(c.count(LayerKind::FullAttention)) * 2 * kv * sizeof(bf16) +
                        size_t(c.count(LayerKind::DeltaNet)) * sizeof(float) *
                            (size_t(c.conv_kernel - 1) * c.gdn_conv_channels() +
                             size_t(c.lin_v_heads) * c.lin_k_dim * c.lin_v_dim);
    if (!host) cuda::check_device_memory(need, "a sequence of " + std::to_string(capacity) + " tokens");
    const int n_attention = c.count(LayerKind::FullAttention), n_deltanet = c.count(LayerKind::DeltaNet);
    const size_t row = size_t(c.n_kv_heads) * c.head_dim * sizeof(bf16);
    const size_t conv = size_t(c.conv_kernel - 1) * c.gdn_conv_channels();
    const size_t state = size_t(c.lin_v_heads) * c.lin_k_dim * c.lin_v_dim;
    std::vector<bf16*> k, v;
    std::vector<float*> cs, S;
    if (n_attention) {
      k = s->alloc<bf16>(n_attention, kv, row);
      v = s->alloc<bf16>(n_attention, kv, row);
    }
    if (n_deltanet) {
      cs = s->alloc<float>(n_deltanet, conv);
      S = s->alloc<float>(n_deltanet, state);
    }
    for (int i = 0, a = 0, d = 0; i < c.n_layers; ++i) {
      if (c.layer_kinds[i] == LayerKind::FullAttention) {
        s->k[i] = k[size_t(a)];
        s->v[i] = v[size_t(a++)];
      } else {
        s->conv[i] = cs[size_t(d)];
        s->S[i] = S[size_t(d++)];
      }
    }
    return s;
  }

  std::optional<size_t> free_memory() const override {
    size_t free_b = 0, total_b = 0;
    PETREL_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
  }

  std::unique_ptr<SequenceState> new_mtp_sequence(int capacity) override {
    const ModelConfig& c = c_;
    auto s = std::make_unique<CudaSequence>(stream_);
    s->capacity = capacity;
    const int layers = c.n_layers + c.mtp_layers;
    s->k.assign(layers, nullptr);
    s->v.assign(layers, nullptr);
    const size_t kv = size_t(capacity) * c.n_kv_heads * c.head_dim;
    cuda::check_device_memory(size_t(c.mtp_layers) * 2 * kv * sizeof(bf16),
                              "the draft head's cache of " + std::to_string(capacity) + " tokens");
    const size_t row = size_t(c.n_kv_heads) * c.head_dim * sizeof(bf16);
    const std::vector<bf16*> k = s->alloc<bf16>(c.mtp_layers, kv, row), v = s->alloc<bf16>(c.mtp_layers, kv, row);
    for (int i = c.n_layers; i < layers; ++i) {
      s->k[i] = k[size_t(i - c.n_layers)];
      s->v[i] = v[size_t(i - c.n_layers)];
    }
    return s;
  }

  void to_host(const Tensor& t, float* dst) override {
    std::vector<uint16_t> tmp;
    if (t.elem_size == 4) {
      PETREL_CUDA(cudaMemcpy2DAsync(dst, t.cols * 4, t.data, t.stride * 4, t.cols * 4, t.rows, cudaMemcpyDeviceToHost,
                                    stream_));
      PETREL_CUDA(cudaStreamSynchronize(stream_));
      return;
    }
    tmp.resize(size_t(t.rows * t.cols));
    PETREL_CUDA(cudaMemcpy2DAsync(tmp.data(), t.cols * 2, t.data, t.stride * 2, t.cols * 2, t.rows,
                                  cudaMemcpyDeviceToHost, stream_));
    PETREL_CUDA(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < tmp.size(); ++i) dst[i] = bf16_to_f32(tmp[i]);
  }

  void from_host(const float* src, Tensor t) override {
    std::vector<uint16_t> tmp;
    const void* data = src;
    if (t.elem_size == 2) {
      tmp.resize(size_t(t.rows * t.cols));
      for (size_t i = 0; i < tmp.size(); ++i) tmp[i] = f32_to_bf16(src[i]);
      data = tmp.data();
    }
    PETREL_CUDA(cudaMemcpy2DAsync(t.data, t.stride * t.elem_size, data, t.cols * t.elem_size, t.cols * t.elem_size,
                                  t.rows, cudaMemcpyHostToDevice, stream_));
    PETREL_CUDA(cudaStreamSynchronize(stream_));
  }

  // stage_ids has waited for any replay still reading the pinned inputs, the token's number among them.
  void begin_forward(const int32_t* ids, int n, const SequenceState& st) override {
    stage_ids(ids, n);
    token_->advance();
    *h_pos_ = st.n_past;
    step_keys_ = n == 1 ? int(st.n_past) + 1 : 0;
    batch_ = false;
  }

  // Stages each row's position and the table of its sequence's states (embed copies both), which
  // the per-sequence ops of the step read on the device: one launch per op for all rows, the same
  // launches for every step of B rows (run_batch replays them). Prompt pieces' rows come first;
  // each piece's ops run as a chunk of its sequence, from its first row's staged position.
  void begin_batch(const int32_t* ids, SequenceState* const* seqs, int B, const StepPiece* pieces,
                   int n_pieces) override {
    int piece_rows = 0;
    for (int i = 0; i < n_pieces; ++i) piece_rows += pieces[i].rows;
    stage_ids(ids, piece_rows + B);  // first: it waits until the last step's copies read the pinned inputs
    *h_pos_ = n_pieces > 0 ? pieces[0].state->n_past : 0;
    piece_first_rows_.clear();
    for (int i = 0, row = 0; i < n_pieces; ++i) {
      piece_first_rows_.emplace_back(pieces[i].state, row);
      for (int t = 0; t < pieces[i].rows; ++t) h_row_pos_[row++] = pieces[i].state->n_past + t;
    }
    for (int b = 0; b < B; ++b) {
      const auto& s = dynamic_cast<const CudaSequence&>(*seqs[b]);
      h_row_pos_[piece_rows + b] = s.n_past;
      for (int layer = 0; layer < c_.n_layers; ++layer) {
        const bool attn = c_.layer_kinds[layer] == LayerKind::FullAttention;
        h_row_states_[row_state_slot(layer, 0, b, B)] = attn ? static_cast<void*>(s.k[layer]) : s.conv[layer];
        h_row_states_[row_state_slot(layer, 1, b, B)] = attn ? static_cast<void*>(s.v[layer]) : s.S[layer];
      }
    }
    batch_ = true;
    batch_rows_ = B;
    baked_rows_ = false;
  }

  // A recorded step replays its sequence's graph for its row count, variant and the attention path
  // its context takes, recorded on its second run: the first runs directly, so that whatever its
  // kernels allocate on first use exists before the capture.
  void run(const OpList& ops, SequenceState* recorded, int variant) override {
    if (!recorded || !opt_.graphs || timer_.enabled()) return run_groups(ops);
    auto& s = dynamic_cast<CudaSequence&>(*recorded);
    CudaSequence::RecordedStep& step = s.recorded[{n_tokens_, variant, int(attention_path(s, n_tokens_))}];
    if (!step.exec && !step.seen) {
      step.seen = true;
      return run_groups(ops);
    }
    if (!step.exec) record(ops, step.exec);
    PETREL_CUDA(cudaGraphLaunch(step.exec, stream_));
    PETREL_CUDA(cudaEventRecord(inputs_read_, stream_));  // events recorded while capturing are not queryable
  }

  // Captures the ops into a graph, instantiated into `exec`.
  void record(const OpList& ops, cudaGraphExec_t& exec) {
    cudaGraph_t graph = nullptr;
    PETREL_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      run_groups(ops);
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    PETREL_CUDA(cudaStreamEndCapture(stream_, &graph));
    PETREL_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    PETREL_CUDA(cudaGraphDestroy(graph));
  }

  // A step of B rows replays its graph, recorded on the second step of B rows: the first runs
  // directly, so that whatever its kernels allocate on first use exists before the capture. A
  // step that baked a row's state into a launch (baked_rows_) is never recorded.
  void run_batch(const OpList& ops) override {
    if (!opt_.graphs || timer_.enabled()) return run_groups(ops);
    check(batch_rows_ == n_tokens_, "CUDA run_batch: a step carrying a prompt piece is not replayed");
    BatchGraph& g = batch_graphs_[n_tokens_];
    if (!g.exec && !g.seen) {
      run_groups(ops);
      g.seen = true;
      g.replayable = !baked_rows_;
      return;
    }
    if (!g.replayable) return run_groups(ops);
    if (!g.exec) record(ops, g.exec);
    PETREL_CUDA(cudaGraphLaunch(g.exec, stream_));
    PETREL_CUDA(cudaEventRecord(inputs_read_, stream_));
  }

  void synchronize() override { PETREL_CUDA(cudaStreamSynchronize(stream_)); }

  bool time_ops(bool enable) override {
    timer_.enable(enable);
    return true;
  }
  std::vector<std::pair<std::string, double>> take_op_times() override { return timer_.take(stream_); }

  // Inside a recorded step the post reads the sequence number begin_forward staged for the replay.
  // Where the LM head left candidates of these logits (expect_argmax), only the last stage runs.
  void argmax(const Tensor& logits) override {
    check(logits.elem_size == 4 && logits.rows == 1, "argmax needs one row of fp32 logits");
    const bool left = argmax_left_ == logits.data;
    const cuda::TimedOp timed(timer_, stream_, left ? "argmax (last stage)" : "argmax");
    const cuda::TokenPost post = token_->current(capturing());
    if (left)
      cuda::argmax_final(argmax_scratch_, argmax_left_count_, nullptr, post, stream_);
    else
      cuda::argmax(static_cast<const float*>(logits.data), int(logits.cols), argmax_scratch_, nullptr, post, stream_);
    argmax_expected_ = argmax_left_ = nullptr;
  }

  int32_t greedy_token() override {
    const int32_t token = token_->wait(stream_);
    token_read_ = true;
    return token;
  }

  std::unique_ptr<DeviceSampler> make_sampler(int vocab) override {
    if (!draw_batch_ || vocab != draw_batch_vocab_) {
      draw_batch_ = cuda::make_draw_batch(vocab, stream_);
      draw_batch_vocab_ = vocab;
    }
    return cuda::make_sampler(vocab, stream_, draw_batch_);
  }

  // A recorded one-sequence step has no copy nodes: embed reads the id and the position from mapped
  // pinned memory and copies the position for the later kernels. Those read it before their PDL
  // wait, so they start only once embed has ended (end_programmatic_chain). Other steps copy their
  // inputs first (a recorded batched step as copy nodes from the pinned inputs).
  void embed(const Matrix& table, Tensor out) override {
    const cuda::TimedOp timed(timer_, stream_, "embed");
    const bool capture = capturing();
    if (capture && !batch_) {
      cuda::embed(weights_->matrix(table), m_ids_, int(out.rows), out.data, out.stride, out.elem_size, stream_,
                  {m_pos_, d_pos_});
      end_programmatic_chain();
      return;
    }
    PETREL_CUDA(cudaMemcpyAsync(d_ids_, h_ids_, sizeof(int) * n_tokens_, cudaMemcpyHostToDevice, stream_));
    PETREL_CUDA(cudaMemcpyAsync(d_pos_, h_pos_, sizeof(int), cudaMemcpyHostToDevice, stream_));
    if (batch_) {
      PETREL_CUDA(cudaMemcpyAsync(d_row_pos_, h_row_pos_, sizeof(int) * n_tokens_, cudaMemcpyHostToDevice, stream_));
      PETREL_CUDA(cudaMemcpyAsync(d_row_states_, h_row_states_, sizeof(void*) * row_state_slots(batch_rows_),
                                  cudaMemcpyHostToDevice, stream_));
    }
    if (!capture) PETREL_CUDA(cudaEventRecord(inputs_read_, stream_));  // run_batch records it after a replay
    cuda::embed(weights_->matrix(table), d_ids_, int(out.rows), out.data, out.stride, out.elem_size, stream_);
  }

  void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor out) override {
    const cuda::TimedOp timed(timer_, stream_, "rms_norm");
    cuda::rms_norm(x.data, x.stride, x.elem_size, weights_->vec(w), int(x.rows), int(x.cols), eps, out.data, out.stride,
                   out.elem_size, stream_);
  }

  void linear(const Tensor& x, const Matrix& w, Tensor out) override {
    const cuda::TimedOp timed(timer_, stream_, "linear", w.rows, w.cols);
    const Tensor xin = gemm_input(x);
    cuda::linear(weights_->matrix(w), xin.data, xin.stride, xin.elem_size, int(x.rows), out.data, out.stride,
                 out.elem_size, stream_);
  }

  void linear_many(const Tensor& x, const Matrix* const* ws, const Tensor* outs, int n) {
    const cuda::TimedOp timed(timer_, stream_, "linear_many", n, ws[0]->cols);
    const Projections p = projections(ws, outs, n);
    const Tensor xin = gemm_input(x);
    cuda::linear_many(p.mats, p.dst, n, xin.data, xin.stride, xin.elem_size, int(x.rows), stream_);
  }

  // Few rows: the staged GEMV applies the norm while staging h (x is not written).
  void rms_norm_linear_many(const Tensor& h, const std::vector<float>& w, float eps, Tensor x, const Matrix* const* ws,
                            const Tensor* outs, int n, cuda::Feeds feeds) {
    const Projections p = projections(ws, outs, n);
    if (!cuda::gemv_stageable(p.mats, n, int(h.rows), h.stride, /*norm=*/true)) {
      rms_norm(h, w, eps, x);
      return linear_many(x, ws, outs, n);
    }
    const cuda::TimedOp timed(timer_, stream_, "rms_norm + linear_many", n, ws[0]->cols);
    if (n == 1 && h.rows == 1 && outs[0].data == argmax_expected_) {  // the LM head, an argmax to follow
      argmax_expected_ = nullptr;
      argmax_left_count_ = cuda::linear_argmax(*p.mats[0], p.dst[0], h.data, h.stride, h.elem_size,
                                               {weights_->vec(w), eps}, cuda::argmax_candidates(argmax_scratch_),
                                               stream_);
      if (argmax_left_count_ > 0) {
        argmax_left_ = outs[0].data;
        return;
      }
    }
    // One token's DeltaNet step (a block per value head) starts beside its input projections and
    // loads its states while they run; so does a short context's attention (a block per query head),
    // which copies its older keys.
    const bool short_attention = feeds == cuda::Feeds::Attention && !batch_ && step_keys_ > 0 &&
                                 cuda::attention_short_fits(step_keys_, c_.n_heads, c_.n_kv_heads, c_.head_dim);
    const int leave = h.rows != 1                ? 0
                      : feeds == cuda::Feeds::DeltaNet ? cuda::deltanet_decode_blocks(gdn_shape())
                      : short_attention          ? c_.n_heads
                                                 : 0;
    cuda::linear_many_staged(p.mats, p.dst, n, h.data, h.stride, h.elem_size, int(h.rows), {weights_->vec(w), eps},
                             stream_, leave);
  }

  // Few rows: the staged GEMV adds its rows to h itself (scratch is not written); a batched step's
  // rows kernel does too, each output rounded to bf16 first as the scratch would hold it.
  void linear_add(const Tensor& x, const Matrix& w, Tensor h, Tensor scratch) {
    const DeviceMatrix* m = &weights_->matrix(w);
    const cuda::GemvOut dst{h.data, h.stride, h.elem_size, /*add=*/true};
    if (!cuda::gemv_stageable(&m, 1, int(x.rows), x.stride, /*norm=*/false)) {
      if (x.rows > cuda::kRowsMaxTokens || h.elem_size != 4 || x.stride % 8 != 0 || !cuda::linear_rows_fits(*m)) {
        linear(x, w, scratch);
        return add(h, scratch);
      }
      const cuda::TimedOp timed(timer_, stream_, "linear + add", w.rows, w.cols);
      const Tensor xin = gemm_input(x);
      return cuda::linear_rows(&m, &dst, 1, xin.data, xin.stride, xin.elem_size, int(x.rows), stream_);
    }
    const cuda::TimedOp timed(timer_, stream_, "linear + add", w.rows, w.cols);
    cuda::linear_many_staged(&m, &dst, 1, x.data, x.stride, x.elem_size, int(x.rows), {}, stream_);
  }

  void add(Tensor h, const Tensor& a) override {
    const cuda::TimedOp timed(timer_, stream_, "add");
    cuda::add_inplace(h.data, h.stride, h.elem_size, bf(a), a.stride, int(h.rows), int(h.cols), stream_);
  }

  void qk_norm_rope(Tensor q, Tensor k, const AttentionWeights& w) override {
    const ModelConfig& c = c_;
    const cuda::TimedOp timed(timer_, stream_, "qk_norm_rope");
    if (!batch_) return qk_norm_rope_at(q, k, w, d_pos_);
    check(q.rows == n_tokens_, "CUDA qk_norm_rope: a batched step's q must have every staged row");
    cuda::qk_norm_rope_rows(bf(q), q.stride, c.n_heads, weights_->vec(w.q_norm), bf(k), k.stride, c.n_kv_heads,
                            weights_->vec(w.k_norm), int(q.rows), c.head_dim, c.rms_eps, c.rotary_dim, c.rope_theta,
                            d_row_pos_, stream_);
  }

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer, SequenceState& st,
                 Tensor out) override {
    const cuda::TimedOp timed(timer_, stream_, "attention");
    attention_at(q, k, v, gate, layer, st, out, chunk_pos(st));
  }

  // Where a chunk of st starts, on the device: a mixed step's piece starts at its first row's
  // staged position, any other chunk at the one staged position.
  const int* chunk_pos(const SequenceState& st) const {
    if (batch_)
      for (const auto& [piece, row] : piece_first_rows_)
        if (piece == &st) return d_row_pos_ + row;
    return d_pos_;
  }

  // One token of a context up to kCudaClusterAttentionKeys: the norms, the append and the attention
  // in one launch (one block a query head, or a cluster of blocks a KV head). Each path's recorded
  // step is kept apart (run_decode_step).
  void qk_norm_rope_attention(Tensor q, Tensor k, const Tensor& v, const Tensor* gate, const AttentionWeights& w,
                              int layer, SequenceState& st, Tensor out) {
    const AttentionPath path = attention_path(st, q.rows);
    if (path == AttentionPath::Split) {
      qk_norm_rope(q, k, w);
      return attention(q, k, v, gate, layer, st, out);
    }
    const ModelConfig& c = c_;
    const cuda::TimedOp timed(timer_, stream_, "qk_norm_rope + attention");
    auto& s = dynamic_cast<CudaSequence&>(st);
    check(st.n_past < st.capacity, "context full: " + std::to_string(st.n_past + 1) +
                                       " tokens exceed the sequence capacity of " + std::to_string(st.capacity));
    const cuda::ShortAttention a{bf(q), bf(k), bf(v), gate ? bf(*gate) : nullptr, weights_->vec(w.q_norm),
                                 weights_->vec(w.k_norm), c.rms_eps, c.rope_theta, c.rotary_dim, c.n_heads,
                                 c.n_kv_heads, s.k[layer], s.v[layer], d_pos_, /*settled=*/capturing(), bf(out),
                                 cluster_records_};
    if (path == AttentionPath::Short) {
      cuda::attention_short(a, c.head_dim, stream_);
      mixer_blocks_ = c.n_heads;
    } else {
      const int width = cluster_width(st);
      cuda::attention_cluster(a, c.head_dim, width, stream_);
      mixer_blocks_ = cuda::kClusterAttentionBlocks * width * c.n_kv_heads;
    }
  }

  // How a step of `rows` tokens of st attends: one token (not batched) of a context, the new key
  // included, that attention_short or attention_cluster holds runs as one launch; else the ops apart.
  enum class AttentionPath { Split, Cluster, WideCluster, Short };
  AttentionPath attention_path(const SequenceState& st, int64_t rows) const {
    if (rows != 1 || batch_) return AttentionPath::Split;
    if (cuda::attention_short_fits(int(st.n_past) + 1, c_.n_heads, c_.n_kv_heads, c_.head_dim))
      return AttentionPath::Short;
    const int width = cluster_width(st);
    return width == 0 ? AttentionPath::Split : width == 1 ? AttentionPath::Cluster : AttentionPath::WideCluster;
  }
  // Clusters a KV head attention_cluster takes for st's next token (0: not that launch).
  int cluster_width(const SequenceState& st) const {
    return cuda::attention_cluster_width(int(st.n_past) + 1, c_.n_heads, c_.n_kv_heads, c_.head_dim);
  }

  void attention_batch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                       SequenceState* const* seqs, Tensor out) override {
    const ModelConfig& c = c_;
    const int B = int(q.rows);
    const cuda::TimedOp timed(timer_, stream_, "attention");
    check(batch_ && B == batch_rows_,
          "CUDA attention_batch: needs the step staged by begin_batch, one row per sequence");
    for (int r = 0; r < B; ++r)
      check(seqs[r]->n_past < seqs[r]->capacity, "context full: sequence " + std::to_string(r) + " holds " +
                                                     std::to_string(seqs[r]->capacity) + " tokens");
    check(k.stride == v.stride, "CUDA attention: k and v must share a row stride");
    const cuda::KvRows rows{row_states<bf16>(layer, 0), row_states<bf16>(layer, 1), d_row_pos_ + (n_tokens_ - B)};
    // Each row split as a lone decode step splits it (the same sums: the same result) where the
    // partial records hold that many.
    const int splits = attention_splits(B);
    if (cuda::attention_appends(bf(q), q.stride, c.n_heads, c.n_kv_heads, c.head_dim)) {
      cuda::attention_appending(bf(q), q.stride, B, {bf(k), bf(v), k.stride}, nullptr, nullptr, c.n_heads,
                                c.n_kv_heads, c.head_dim, nullptr, rows, /*keys_settled=*/false, splits, attn_partial_,
                                gate ? bf(*gate) : nullptr, gate ? gate->stride : 0, bf(out), out.stride, stream_);
      return;
    }
    cuda::kv_append_rows(bf(k), bf(v), k.stride, B, c.n_kv_heads * c.head_dim, rows, stream_);
    cuda::attention_rows(bf(q), q.stride, B, rows, c.n_heads, c.n_kv_heads, c.head_dim, splits, attn_partial_,
                         gate ? bf(*gate) : nullptr, gate ? gate->stride : 0, bf(out), out.stride, stream_);
  }

  void deltanet(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a, const DeltaNetWeights& w,
                int layer, SequenceState& st, Tensor out) override {
    auto& s = dynamic_cast<CudaSequence&>(st);
    const ModelConfig& c = c_;
    const int T = int(qkv.rows);
    const cuda::DeltaNetShape d = gdn_shape();
    check(b.elem_size == 4 && a.elem_size == 4, "CUDA deltanet: b and a must be fp32 tensors");
    if (T == 1) {
      const cuda::TimedOp timed(timer_, stream_, "deltanet");
      // Settled states (loaded before the PDL wait) only in a recorded one-token step: a drafted
      // verify step runs a layer's step once a row, each after the state the one before writes.
      const bool settled = capturing() && step_keys_ > 0;
      if (cuda::deltanet_decode(d, bf(qkv), weights_->vec(w.conv), s.conv[layer], f32(b), f32(a),
                                weights_->vec(w.A_log), weights_->vec(w.dt_bias), s.S[layer], weights_->vec(w.norm),
                                bf(z), c.rms_eps, bf(out), gdn_readers_, settled, stream_)) {
        mixer_blocks_ = cuda::deltanet_decode_blocks(d);
        return;
      }
    }
    {
      const cuda::TimedOp part(timer_, stream_, "deltanet: conv + norms");
      cuda::causal_conv_silu(bf(qkv), qkv.stride, T, c.gdn_conv_channels(), c.conv_kernel, weights_->vec(w.conv),
                             s.conv[layer], gdn_u_, stream_);
      cuda::deltanet_prepare(d, gdn_u_, T, f32(b), b.stride, f32(a), a.stride, weights_->vec(w.A_log),
                             weights_->vec(w.dt_bias), gdn_q_, gdn_k_, gdn_v_, gdn_beta_, gdn_g_, stream_);
    }
    if (T == 1) {
      const cuda::TimedOp part(timer_, stream_, "deltanet: delta rule");
      cuda::delta_rule_recurrent(d, T, gdn_q_, gdn_k_, gdn_v_, gdn_beta_, gdn_g_, s.S[layer], gdn_o_, stream_);
    } else {
      {
        const cuda::TimedOp part(timer_, stream_, "deltanet: chunk prepare");
        cuda::delta_rule_chunk_prepare(d, T, gdn_q_, gdn_k_, gdn_v_, gdn_beta_, gdn_g_, gdn_chunks_, stream_);
      }
      const cuda::TimedOp part(timer_, stream_, "deltanet: chunk state");
      cuda::delta_rule_chunk_state(d, T, gdn_q_, gdn_k_, gdn_chunks_, s.S[layer], gdn_o_, stream_);
    }
    const cuda::TimedOp part(timer_, stream_, "deltanet: gated norm");
    cuda::gated_rms_norm(d, gdn_o_, T, weights_->vec(w.norm), bf(z), z.stride, c.rms_eps, bf(out), out.stride, stream_);
  }

  void deltanet_batch(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a, const DeltaNetWeights& w,
                      int layer, SequenceState* const* seqs, Tensor out) override {
    check(batch_ && qkv.rows == batch_rows_,
          "CUDA deltanet_batch: needs the step staged by begin_batch, one row per sequence");
    check(b.elem_size == 4 && a.elem_size == 4, "CUDA deltanet: b and a must be fp32 tensors");
    {
      const cuda::TimedOp timed(timer_, stream_, "deltanet");
      const cuda::DeltaNetRows rows{int(qkv.rows), qkv.stride, b.stride, a.stride, z.stride, out.stride,
                                    row_states<float>(layer, 0), row_states<float>(layer, 1)};
      if (cuda::deltanet_decode_rows(gdn_shape(), rows, bf(qkv), weights_->vec(w.conv), f32(b), f32(a),
                                     weights_->vec(w.A_log), weights_->vec(w.dt_bias), weights_->vec(w.norm), bf(z),
                                     c_.rms_eps, bf(out), gdn_readers_, stream_))
        return;
    }
    baked_rows_ = true;  // the per-sequence fallback launches with each row's own state pointers
    Backend::deltanet_batch(qkv, z, b, a, w, layer, seqs, out);  // shapes the fused kernel does not cover
  }

  void mlp(const Tensor& x, const MlpWeights& w, Tensor out) override {
    const int T = int(x.rows), I = int(w.gate.rows);
    const int64_t stride = (I + 7) / 8 * 8;
    const cuda::TimedOp timed(timer_, stream_, "mlp");
    const Tensor xin = gemm_input(x);
    const DeviceMatrix* gate_up[] = {&weights_->matrix(w.gate), &weights_->matrix(w.up)};
    const cuda::GemvOut outs[] = {{mlp_g_, stride, 2}, {mlp_u_, stride, 2}};
    cuda::linear_many(gate_up, outs, 2, xin.data, xin.stride, xin.elem_size, T, stream_);
    cuda::silu_mul(mlp_g_, mlp_u_, stride, T, I, mlp_act_, stride, stream_);
    cuda::linear(weights_->matrix(w.down), mlp_act_, stride, 2, T, out.data, out.stride, out.elem_size, stream_);
  }

  void moe(const Tensor& x, const FfnWeights& w, Tensor out) override { moe_rows(x, w, out, nullptr); }

  // moe(); with an fp32 `residual`, then residual += out: past the GEMV's rows, in the combine's
  // launch (out is not written).
  void moe_rows(const Tensor& x, const FfnWeights& w, Tensor out, const Tensor* residual) {
    const int T = int(x.rows);
    {
      const cuda::TimedOp timed(timer_, stream_, "moe.route");
      moe_route(x, w, {});
    }
    const cuda::TimedOp timed(timer_, stream_, "moe.experts");
    if (T <= cuda::kGemvMaxTokens) {
      moe_experts_decode(x, w, {}, {out.data, out.stride, out.elem_size});
      if (residual) add(*residual, out);
      return;
    }
    const ModelConfig& c = c_;
    const int k = c.top_k;
    const cuda::ExpertStacks& E = weights_->experts(w);
    const int I = c.moe_intermediate;
    const int64_t istride = (I + 7) / 8 * 8;
    const bool rows_kernel = cuda::expert_rows_suit(T, k, c.n_experts) && cuda::linear_rows_fits(E.gate) &&
                             cuda::linear_rows_fits(E.up) && cuda::linear_rows_fits(E.down) &&
                             E.gate.format == E.up.format;
    const Shared sh = shared_of(w);
    const cuda::RidingExpert riding{sh.gate, sh.up, sh.down, c.n_experts};
    const bool rides = rows_kernel && w.has_shared && cuda::expert_rows_carry(E.gate, E.up, E.down, riding);
    const int tiles = cuda::moe_tiles(T, k, c.n_experts, rides);
    cuda::moe_plan(moe_ids_, T, k, c.n_experts, rides, moe_rows_, moe_counts_, moe_row_token_, moe_slot_row_,
                   moe_tile_expert_, stream_);
    const Tensor xin = gemm_input(x);
    if (rows_kernel)
      cuda::expert_rows(E.gate, E.up, E.down, rides ? riding : cuda::RidingExpert{}, xin.data, xin.stride,
                        xin.elem_size, T, moe_row_token_, moe_tile_expert_, tiles, moe_g_, istride, moe_y_, c.hidden,
                        stream_);
    else
      grouped_experts(E, xin, istride, tiles * cuda::kGemmTileM);
    const bf16* shared = rides ? moe_y_ : nullptr;  // the riding shared expert's rows are the first
    if (w.has_shared && !rides) {
      Tensor so{moe_shared_, T, c.hidden, c.hidden, 2};
      mlp(xin, w.shared, so);
      shared = moe_shared_;
    }
    cuda::moe_combine(moe_y_, c.hidden, moe_slot_row_, moe_w_, T, k, c.hidden, moe_sgate_, shared, c.hidden, bf(out),
                      out.stride, residual ? f32(*residual) : nullptr, residual ? residual->stride : 0, stream_);
  }

  // One token: the output projection adds its rows to h and sums the router's values of them
  // beside it (no router launch); the experts pick their top-k from those sums, one of their
  // blocks scaling them by the norm's rsqrt for the weights and the shared gate once it has
  // staged h.
  void linear_add_moe_add(const Tensor& x, const Matrix& w, Tensor h, Tensor scratch, const std::vector<float>& norm,
                          float eps, Tensor xn, const FfnWeights& ffn, Tensor ffn_out) {
    const cuda::RouteSums* cols = weights_->route(ffn);
    const DeviceMatrix& m = weights_->matrix(w);
    const cuda::ExpertStacks& E = weights_->experts(ffn);
    const Shared sh = shared_of(ffn);
    const int mixer_blocks = std::exchange(mixer_blocks_, 0);  // read here or never (a drafted row's mixer)
    const bool beside = cols && h.rows == 1 && h.elem_size == 4 && experts_pick(ffn, 1) &&
                        cuda::moe_norm_stageable(weights_->matrix(ffn.router), sh.gate_row, E.gate, E.up, E.down,
                                                 sh.gate, sh.up, sh.down, c_.top_k, 1, h.stride) &&
                        cuda::gemv_route_fits(m, x.stride, *cols);
    if (!beside) {
      linear_add(x, w, h, scratch);
      return rms_norm_moe_add(h, norm, eps, xn, ffn, ffn_out);
    }
    cuda::RouteSums route = *cols;
    route.sums = route_sums_;
    {
      const cuda::TimedOp timed(timer_, stream_, "linear + add + router sums", w.rows, w.cols);
      cuda::linear_add_route(m, {h.data, h.stride, h.elem_size, /*add=*/true}, x.data, x.stride, x.elem_size, route,
                             mixer_blocks, stream_);
    }
    cuda::TopK pick;
    pick.sums = route_sums_;
    pick.sgate = ffn.has_shared ? moe_sgate_ : nullptr;
    pick.E = c_.n_experts;
    pick.renorm = c_.norm_topk_prob;
    const cuda::GemvOut out{h.data, h.stride, h.elem_size, /*add=*/true};
    const cuda::StageNorm staged_norm{weights_->vec(norm), eps};
    const cuda::TimedOp timed(timer_, stream_, "moe.experts + add");
    cuda::moe_decode(E.gate, E.up, E.down, sh.gate, sh.up, sh.down, h.data, h.stride, h.elem_size, 1, c_.top_k, moe_ids_,
                     moe_w_, moe_sgate_, moe_decode_act_, staged_norm, pick, out, stream_);
  }

  // Few rows: router and experts apply the norm while staging h, and the down projection adds its
  // rows to h (x and scratch are not written).
  void rms_norm_moe_add(Tensor h, const std::vector<float>& norm, float eps, Tensor x, const FfnWeights& w,
                        Tensor scratch) {
    const cuda::ExpertStacks& E = weights_->experts(w);
    const Shared sh = shared_of(w);
    if (!cuda::moe_norm_stageable(weights_->matrix(w.router), sh.gate_row, E.gate, E.up, E.down, sh.gate, sh.up,
                                  sh.down, c_.top_k, int(h.rows), h.stride)) {
      rms_norm(h, norm, eps, x);
      if (h.elem_size == 4) return moe_rows(x, w, scratch, &h);
      moe(x, w, scratch);
      return add(h, scratch);
    }
    const cuda::StageNorm n{weights_->vec(norm), eps};
    {
      const cuda::TimedOp timed(timer_, stream_, "rms_norm + moe.route");
      moe_route(h, w, n);
    }
    const cuda::TimedOp timed(timer_, stream_, "moe.experts + add");
    moe_experts_decode(h, w, n, {h.data, h.stride, h.elem_size, /*add=*/true});
  }

 private:
  // Runs a step's ops, each group of neighbours (op_groups.h) by the fused form that covers it.
  void run_groups(const OpList& ops) {
    for (const cuda::OpGroup& g : cuda::group_ops(ops)) run_group(ops, g);
  }

  void run_group(const OpList& ops, const cuda::OpGroup& g) {
    const auto op = [&](int i) -> const Op& { return ops[size_t(g.first + i)]; };
    switch (g.group) {
      case cuda::Group::Op:
        return run_op(op(0));
      case cuda::Group::Linears:
      case cuda::Group::NormLinears: {
        const int first = g.group == cuda::Group::NormLinears ? 1 : 0;
        const int n = g.count - first;
        const Matrix* ws[cuda::kMaxGroupedLinears];
        Tensor outs[cuda::kMaxGroupedLinears];
        for (int i = 0; i < n; ++i) {
          const auto& l = std::get<op::Linear>(op(first + i));
          ws[i] = l.w;
          outs[i] = l.out;
        }
        const Tensor x = std::get<op::Linear>(op(first)).x;
        if (first == 0) return linear_many(x, ws, outs, n);
        const auto& norm = std::get<op::RmsNorm>(op(0));
        if (g.argmax_follows) argmax_expected_ = outs[0].data;
        return rms_norm_linear_many(norm.x, *norm.w, norm.eps, norm.out, ws, outs, n, g.feeds);
      }
      case cuda::Group::LinearAdd: {
        const auto& l = std::get<op::Linear>(op(0));
        return linear_add(l.x, *l.w, std::get<op::Add>(op(1)).h, l.out);
      }
      case cuda::Group::NormMoeAdd: {
        const auto& norm = std::get<op::RmsNorm>(op(0));
        const auto& moe = std::get<op::Moe>(op(1));
        return rms_norm_moe_add(norm.x, *norm.w, norm.eps, norm.out, *moe.w, moe.out);
      }
      case cuda::Group::LinearAddNormMoeAdd: {
        const auto& l = std::get<op::Linear>(op(0));
        const auto& norm = std::get<op::RmsNorm>(op(2));
        const auto& moe = std::get<op::Moe>(op(3));
        return linear_add_moe_add(l.x, *l.w, norm.x, l.out, *norm.w, norm.eps, norm.out, *moe.w, moe.out);
      }
      case cuda::Group::NormRopeAttention: {
        const auto& r = std::get<op::QkNormRope>(op(0));
        const auto& a = std::get<op::Attention>(op(1));
        return qk_norm_rope_attention(r.q, r.k, a.v, a.gate.data ? &a.gate : nullptr, *r.w, a.layer, *a.states.chunk,
                                      a.out);
      }
    }
  }

  // A layer's projections as device matrices and output views (no heap work per call).
  static constexpr int kMaxProjections = cuda::kMaxGroupedLinears;
  struct Projections {
    const DeviceMatrix* mats[kMaxProjections];
    cuda::GemvOut dst[kMaxProjections];
  };
  Projections projections(const Matrix* const* ws, const Tensor* outs, int n) const {
    check(n <= kMaxProjections, "CUDA linear_many: at most 8 matrices per call");
    Projections p;
    for (int i = 0; i < n; ++i) {
      p.mats[i] = &weights_->matrix(*ws[i]);
      p.dst[i] = {outs[i].data, outs[i].stride, outs[i].elem_size};
    }
    return p;
  }

  // The shared expert's matrices (null where the block has none) and its gate row.
  struct Shared {
    const DeviceMatrix *gate = nullptr, *up = nullptr, *down = nullptr, *gate_row = nullptr;
  };
  Shared shared_of(const FfnWeights& w) const {
    if (!w.has_shared) return {};
    return {&weights_->matrix(w.shared.gate), &weights_->matrix(w.shared.up), &weights_->matrix(w.shared.down),
            &weights_->matrix(w.shared_gate)};
  }

  // True where the experts of `rows` rows pick their own top-k from the router's logits.
  bool experts_pick(const FfnWeights& w, int rows) const {
    const cuda::ExpertStacks& E = weights_->experts(w);
    const Shared sh = shared_of(w);
    return cuda::moe_experts_pick(E.gate, E.up, E.down, sh.gate, sh.up, sh.down, c_.top_k, rows);
  }

  // Router softmax + top-k of rows x (normed by `norm` where set) -> moe_ids_, moe_w_, moe_sgate_
  // (the top-k left to the experts where they pick it).
  void moe_route(const Tensor& x, const FfnWeights& w, cuda::StageNorm norm) {
    const ModelConfig& c = c_;
    cuda::moe_route(weights_->matrix(w.router), shared_of(w).gate_row, x.data, x.stride, x.elem_size, int(x.rows),
                    c.n_experts, c.top_k, c.norm_topk_prob, moe_logits_, moe_ids_, moe_w_, moe_sgate_, moe_route_done_,
                    norm, experts_pick(w, int(x.rows)), stream_);
  }

  // The routed experts of a few rows (after moe_route) into out.
  void moe_experts_decode(const Tensor& x, const FfnWeights& w, cuda::StageNorm norm, const cuda::GemvOut& out) {
    const cuda::ExpertStacks& E = weights_->experts(w);
    const Shared sh = shared_of(w);
    cuda::TopK pick;
    if (experts_pick(w, int(x.rows))) {
      pick.logits = moe_logits_;
      pick.E = c_.n_experts;
      pick.renorm = c_.norm_topk_prob;
    }
    cuda::moe_decode(E.gate, E.up, E.down, sh.gate, sh.up, sh.down, x.data, x.stride, x.elem_size, int(x.rows),
                     c_.top_k, moe_ids_, moe_w_, moe_sgate_, moe_decode_act_, norm, pick, out, stream_);
  }

  // Many rows' routed experts (after moe_plan) by the grouped GEMM: gate, up, SiLU·mul, down.
  // `rows`: the plan's tiles in use (cuda::moe_tiles), in rows.
  void grouped_experts(const cuda::ExpertStacks& E, const Tensor& xin, int64_t istride, int rows) {
    const int I = c_.moe_intermediate;
    cuda::grouped_linear(E.gate, xin.data, xin.stride, xin.elem_size, moe_row_token_, moe_tile_expert_, rows, moe_g_,
                         istride, stream_);
    cuda::grouped_linear(E.up, xin.data, xin.stride, xin.elem_size, moe_row_token_, moe_tile_expert_, rows, moe_u_,
                         istride, stream_);
    cuda::silu_mul(moe_g_, moe_u_, istride, rows, I, moe_g_, istride, stream_);
    cuda::grouped_linear(E.down, moe_g_, istride, 2, nullptr, moe_tile_expert_, rows, moe_y_, c_.hidden, stream_);
  }

  // True while run_decode_step records a step into a graph.
  bool capturing() const {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PETREL_CUDA(cudaStreamIsCapturing(stream_, &capture));
    return capture != cudaStreamCaptureStatusNone;
  }

  // While capturing: an empty node after the last captured kernel, so that the next kernel's edge is
  // an ordinary one (it starts after that kernel's end and sees its writes) rather than programmatic.
  void end_programmatic_chain() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    const cudaGraphEdgeData* edges = nullptr;  // queried only so that any edge data is accepted
    size_t n = 0;
    PETREL_CUDA(cudaStreamGetCaptureInfo(stream_, &status, nullptr, &graph, &deps, &edges, &n));
    cudaGraphNode_t barrier = nullptr;
    PETREL_CUDA(cudaGraphAddEmptyNode(&barrier, graph, deps, n));
    PETREL_CUDA(cudaStreamUpdateCaptureDependencies(stream_, &barrier, nullptr, 1, cudaStreamSetCaptureDependencies));
  }

  void stage_ids(const int32_t* ids, int n) {
    check(n <= max_tokens_, "CUDA backend: chunk of " + std::to_string(n) + " tokens exceeds the reserved " +
                                std::to_string(max_tokens_));
    // The previous chunk's copies, or a replayed step, may still read the pinned inputs: wait only
    // then. Not in a decode loop: a posted token means every kernel before its post has ended, and a
    // sampler's token is posted after the step's graph.
    if (!token_read_) {
      const cudaError_t read = cudaEventQuery(inputs_read_);
      if (read == cudaErrorNotReady) PETREL_CUDA(cudaEventSynchronize(inputs_read_));
      else PETREL_CUDA(read);
    }
    token_read_ = false;
    for (int t = 0; t < n; ++t) {
      check(ids[t] >= 0 && ids[t] < c_.vocab, "token id " + std::to_string(ids[t]) + " at position " +
                                                  std::to_string(t) + " is outside the vocabulary (0.." +
                                                  std::to_string(c_.vocab - 1) + ")");
      h_ids_[t] = ids[t];
    }
    n_tokens_ = n;
  }

  // qk_norm_rope with row t of q and k at position *pos0 + t.
  void qk_norm_rope_at(Tensor q, Tensor k, const AttentionWeights& w, const int* pos0) {
    const ModelConfig& c = c_;
    check(q.rows == k.rows, "CUDA qk_norm_rope: q and k must have the same rows");
    cuda::qk_norm_rope(bf(q), q.stride, c.n_heads, weights_->vec(w.q_norm), bf(k), k.stride, c.n_kv_heads,
                       weights_->vec(w.k_norm), int(q.rows), c.head_dim, c.rms_eps, c.rotary_dim, c.rope_theta, pos0,
                       stream_);
  }

  // Key ranges of the split-K attention over `rows` query rows: as many as the partial records
  // hold, up to 64 (a long context's keys then spread over every SM; the kernels use only as many
  // as the context needs).
  int attention_splits(int rows) const {
    return int(std::clamp<int64_t>(attn_partial_records_ / (int64_t(rows) * c_.n_heads), 1, 64));
  }

  // attention with row t of q at position *pos0 + t of `st` (the device copy of st.n_past).
  void attention_at(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                    SequenceState& st, Tensor out, const int* pos0) {
    auto& s = dynamic_cast<CudaSequence&>(st);
    const ModelConfig& c = c_;
    const int T = int(q.rows);
    check(st.n_past + T <= st.capacity, "context full: " + std::to_string(st.n_past + T) +
                                            " tokens exceed the sequence capacity of " + std::to_string(st.capacity));
    check(k.stride == v.stride, "CUDA attention: k and v must share a row stride");
    const int splits = attention_splits(T);
    if (T == 1 && cuda::attention_appends(bf(q), q.stride, c.n_heads, c.n_kv_heads, c.head_dim)) {
      cuda::attention_appending(bf(q), q.stride, 1, {bf(k), bf(v), k.stride}, s.k[layer], s.v[layer], c.n_heads,
                                c.n_kv_heads, c.head_dim, pos0, cuda::KvRows{}, /*keys_settled=*/capturing(), splits,
                                attn_partial_, gate ? bf(*gate) : nullptr, gate ? gate->stride : 0, bf(out), out.stride,
                                stream_);
      return;
    }
    cuda::kv_append(bf(k), bf(v), k.stride, T, c.n_kv_heads * c.head_dim, s.k[layer], s.v[layer], pos0, stream_);
    cuda::attention(bf(q), q.stride, T, s.k[layer], s.v[layer], c.n_heads, c.n_kv_heads, c.head_dim, pos0,
                    /*keys_settled=*/capturing(), splits, attn_partial_, gate ? bf(*gate) : nullptr,
                    gate ? gate->stride : 0, bf(out), out.stride, stream_);
  }

  // The batched step's table holds, per layer, slot 0 (conv state or K cache) of rows 0..B-1, then
  // slot 1 (recurrent state or V cache): one copy of 2·layers·B pointers per step.
  size_t row_state_slots(int B) const { return size_t(c_.n_layers) * 2 * size_t(B); }
  static size_t row_state_slot(int layer, int slot, int row, int B) {
    return (size_t(layer) * 2 + size_t(slot)) * size_t(B) + size_t(row);
  }
  // Row b's state `slot` of `layer` on the device, b = 0..B-1, as begin_batch staged them.
  template <typename T>
  T* const* row_states(int layer, int slot) const {
    return reinterpret_cast<T* const*>(d_row_states_ + row_state_slot(layer, slot, 0, batch_rows_));
  }

  cuda::DeltaNetShape gdn_shape() const {
    return {c_.lin_k_heads, c_.lin_v_heads, c_.lin_k_dim, c_.lin_v_dim, c_.conv_kernel};
  }
  // Prefill GEMMs copy bf16 rows asynchronously: an fp32 input (a norm output) is rounded once
  // here, as the GEMM would round it when staging. Decode-sized inputs stay fp32 for the GEMV.
  Tensor gemm_input(const Tensor& x) {
    if (x.elem_size != 4 || x.rows <= cuda::kGemvMaxTokens || x.cols > c_.hidden) return x;
    const Tensor r{x_bf16_, x.rows, x.cols, (x.cols + 7) / 8 * 8, 2};
    cuda::round_to_bf16(f32(x), x.stride, int(x.rows), int(x.cols), x_bf16_, r.stride, stream_);
    return r;
  }
  static bf16* bf(const Tensor& t) { return static_cast<bf16*>(t.data); }
  static float* f32(const Tensor& t) { return static_cast<float*>(t.data); }

  // Pinned host memory the device reads in place; *device gets its device address.
  static int* alloc_mapped(int64_t n, int** device) {
    int* p = nullptr;
    PETREL_CUDA(cudaHostAlloc(&p, sizeof(int) * size_t(n), cudaHostAllocMapped));
    PETREL_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(device), p, 0));
    return p;
  }

  template <typename T>
  T* alloc_raw(size_t n) {
    void* p = nullptr;
    cuda::check_device_memory(n * sizeof(T), "activation scratch");
    PETREL_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    PETREL_CUDA(cudaMemsetAsync(p, 0, std::max<size_t>(n, 1) * sizeof(T), stream_));
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }

  CudaOptions opt_;
  cudaStream_t stream_ = nullptr;
  cuda::OpTimer timer_;
  ModelConfig c_;
  std::unique_ptr<cuda::DeviceWeights> weights_;
  std::vector<void*> allocations_;
  int max_tokens_ = 0, n_tokens_ = 0;
  int batch_rows_ = 0;  // rows of a batched step with a state each (after the prompt pieces' rows)
  std::vector<std::pair<const SequenceState*, int>> piece_first_rows_;  // a mixed step's pieces
  int *h_ids_ = nullptr, *h_pos_ = nullptr;  // pinned, mapped: a recorded step's embed reads them in place
  int *m_ids_ = nullptr, *m_pos_ = nullptr;  // their device addresses
  cudaEvent_t inputs_read_ = nullptr;  // recorded once the device has read the pinned inputs
  int *d_ids_ = nullptr, *d_pos_ = nullptr;
  std::unique_ptr<cuda::TokenMailbox> token_;  // where argmax posts the greedy token
  std::shared_ptr<cuda::DrawBatch> draw_batch_;  // shared by the samplers make_sampler gives out
  int draw_batch_vocab_ = 0;
  bool token_read_ = false;  // greedy_token has read the token of the chunk staged last
  int *h_row_pos_ = nullptr, *d_row_pos_ = nullptr;  // per-row positions of a batched step
  void **h_row_states_ = nullptr, **d_row_states_ = nullptr;  // its per-row state table (row_state_slot)
  bool batch_ = false;  // the staged step is a batch (begin_batch)
  bool baked_rows_ = false;  // the staged batch ran an op that launched with one row's state pointers
  struct BatchGraph {
    bool seen = false;        // a step of this many rows has run
    bool replayable = false;  // ... and read rows only through the staged table
    cudaGraphExec_t exec = nullptr;
  };
  std::map<int, BatchGraph> batch_graphs_;  // by row count
  int step_keys_ = 0;   // keys (its own included) of the staged one-token step's attention; 0 otherwise
  float* attn_partial_ = nullptr;
  unsigned long long* cluster_records_ = nullptr;  // the wide cluster attention's records, empty between launches
  int64_t attn_partial_records_ = 0;  // split-K records attn_partial_ holds
  float* argmax_scratch_ = nullptr;
  const void* argmax_expected_ = nullptr;  // logits an Argmax reads next, until the LM head writes them
  const void* argmax_left_ = nullptr;  // the logits whose argmax candidates the LM head left in argmax_scratch_
  int argmax_left_count_ = 0;
  int mixer_blocks_ = 0;  // the one-token mixer just launched: its blocks' multiprocessors (linear_add_route)
  float *gdn_u_ = nullptr, *gdn_q_ = nullptr, *gdn_k_ = nullptr, *gdn_v_ = nullptr, *gdn_o_ = nullptr;
  float *gdn_beta_ = nullptr, *gdn_g_ = nullptr, *gdn_chunks_ = nullptr;
  int* gdn_readers_ = nullptr;  // per (row, key head) counters of the DeltaNet decode kernel
  bf16 *mlp_g_ = nullptr, *mlp_u_ = nullptr, *mlp_act_ = nullptr;
  bf16* x_bf16_ = nullptr;  // prefill GEMM input rounded from fp32 (gemm_input)
  int *moe_ids_ = nullptr, *moe_counts_ = nullptr, *moe_row_token_ = nullptr, *moe_slot_row_ = nullptr;
  int* moe_tile_expert_ = nullptr;
  int* moe_route_done_ = nullptr;  // per-token counters of the fused router + top-k
  unsigned long long* route_sums_ = nullptr;  // the router sums beside one token's output projection (zero between uses)
  float *moe_w_ = nullptr, *moe_sgate_ = nullptr, *moe_decode_act_ = nullptr, *moe_logits_ = nullptr;
  bf16 *moe_g_ = nullptr, *moe_u_ = nullptr, *moe_y_ = nullptr, *moe_shared_ = nullptr;
  int moe_rows_ = 0;
};

}  // namespace

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string cuda_device_summary() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "no CUDA device found";
  cudaDeviceProp p{};
  PETREL_CUDA(cudaGetDeviceProperties(&p, 0));
  size_t free_b = 0, total_b = 0;
  PETREL_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + format_bytes(double(free_b)) + " free of " +
         format_bytes(double(total_b)) + ")";
}

double cuda_copy_bandwidth() {
  const size_t bytes = 2ull << 30;
  void *a = nullptr, *b = nullptr;
  PETREL_CUDA(cudaMalloc(&a, bytes));
  PETREL_CUDA(cudaMalloc(&b, bytes));
  cudaEvent_t start, stop;
  PETREL_CUDA(cudaEventCreate(&start));
  PETREL_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    PETREL_CUDA(cudaEventRecord(start));
    PETREL_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    PETREL_CUDA(cudaEventRecord(stop));
    PETREL_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    PETREL_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i > 0) ms.push_back(t);  // the first copy warms up
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e-3);
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) {
  check(cuda_available(), "--device cuda: " + cuda_device_summary());
  return std::make_unique<CudaBackend>(options);
}

}  // namespace petrel
