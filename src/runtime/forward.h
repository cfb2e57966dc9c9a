// Runs a model on a backend: feeds prompts in chunks and decode steps, each step the op list of
// model/step_ops.h, over scratch allocated once.
#pragma once
#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/step_ops.h"
#include "model/weights.h"

namespace petrel {

// Which logits rows of a forward call are wanted: none, the last token's, or every token's.
// Drafted: every token's, the tokens fed as that many decode steps feed them (DeltaNet one token
// at a time, its recurrent form) in one step of at most Model::kMaxDraftedRows: a speculative
// draft's verify step and the re-feed of its accepted part, whose rows and state are then what
// plain decoding computes (bit for bit on the CPU), where a prompt's chunked form rounds otherwise.
enum class KeepLogits { None, Last, All, Drafted };

struct ForwardOptions {
  int max_chunk = 512;  // prefill is fed in chunks of at most this many tokens
  // The most rows whose logits one step keeps (a batched step's rows, a verify step's), at most
  // max_chunk: the buffer they go to holds this many rows of the vocabulary in fp32 (8 GB for
  // 8192 rows of Qwen3.5's), and every-position logits of a longer prompt come in pieces of it.
  int logit_rows = 512;
};

class Model {
 public:
  Model(const ModelConfig& config, const ModelWeights& weights, Backend& backend, const ForwardOptions& options = {});

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  std::unique_ptr<SequenceState> new_sequence(int capacity) { return backend_.new_sequence(capacity); }
  std::unique_ptr<SequenceState> new_host_sequence(int capacity) { return backend_.new_host_sequence(capacity); }

  // Consumes `n` tokens continuing `st`. Writes logits of the last token into `last_logits`
  // (vocab floats) when non-null, and of every token into `all_logits` (n x vocab) when non-null.
  void forward(const int32_t* ids, int n, SequenceState& st, float* last_logits, float* all_logits = nullptr);
  // Like forward, but the logits stay on the device and only the argmax of the last one comes back.
  int32_t forward_greedy(const int32_t* ids, int n, SequenceState& st);
  // Like forward, but the logits stay in backend memory: returns the fp32 rows `keep` asks for
  // ([1, vocab] for Last; [n, vocab] for All, which needs n <= logit_rows(), and Drafted; no rows
  // for None), valid until the next forward.
  Tensor forward_device(const int32_t* ids, int n, SequenceState& st, KeepLogits keep);

  // One decode step for B distinct sequences, one new token each: ids[b] continues *seqs[b].
  // Projections, norms, MLP/MoE and the LM head run once over the B rows; attention and DeltaNet
  // use each row's own state and position. Row b of `logits` (B x vocab floats) is what forward()
  // of ids[b] on seqs[b] alone would give (bit for bit on the CPU). B is at most max_batch().
  void forward_batch(const int32_t* ids, SequenceState* const* seqs, int B, float* logits);
  // forward_batch with the logits left in backend memory: returns the [B, vocab] fp32 rows, valid
  // until the next forward (a DeviceSampler reads them where they are).
  Tensor forward_batch_device(const int32_t* ids, SequenceState* const* seqs, int B);
  // A decode step (B may be 0) that also feeds `pieces` (prompt pieces of distinct sequences not
  // among seqs), so that prompts advance in the same weight reads as the decoding rows: each
  // piece's rows are computed as forward() of it alone would compute them. Returns the last row's
  // logits of each piece with keep_last (in order), then the decode rows'. The pieces' tokens
  // plus B are at most max_batch().
  struct PromptPiece {
    const int32_t* ids = nullptr;
    int n = 0;
    SequenceState* state = nullptr;
    bool keep_last = false;
  };
  Tensor forward_mixed_device(const int32_t* ids, SequenceState* const* seqs, int B,
                              std::span<const PromptPiece> pieces);
  int max_batch() const { return options_.max_chunk; }
  // KeepLogits::Drafted's most tokens, and the most of an every-row step that is recorded.
  static constexpr int kMaxDraftedRows = 16;
  int logit_rows() const { return std::min(options_.logit_rows, options_.max_chunk); }

  // Multi-token prediction (config().mtp_layers > 0): the checkpoint's draft head.
  bool has_mtp() const { return config_.mtp_layers > 0; }
  std::unique_ptr<SequenceState> new_mtp_sequence(int capacity);
  // Runs the head over `n` rows continuing `mtp`: row t pairs token ids[t] with a hidden state,
  // the last trunk step's row t (from_trunk; n at most that step's rows) or else, for n = 1, the
  // last row of the previous head step, which must have continued `mtp` too. Returns the argmax of the last row's logits: the draft
  // for the position after ids[n-1]. Every row's logits go to `all_logits` (n x vocab) when set.
  int32_t mtp_forward(const int32_t* ids, int n, bool from_trunk, SequenceState& mtp, float* all_logits = nullptr);
  // The residual stream of the last trunk step's rows, before the final norm: the hidden states
  // the head reads (it applies the final norm itself), in backend memory until the next step.
  Tensor last_hidden() const { return buffers_.h.rows_view(0, trunk_rows_); }
  // Allocates now the logits rows batched steps write, so that memory taken later (prefix cache
  // snapshots) cannot leave them without.
  void reserve_batch() { all_logits_buffer(); }

 private:
  void check_fits(int n, const SequenceState& st) const;
  void check_rows(SequenceState* const* seqs, int B, int piece_rows) const;
  void run_chunks(const int32_t* ids, int n, SequenceState& st, bool want_last, float* last_logits, float* all_logits);
  void forward_chunk(const int32_t* ids, int T, SequenceState& st, bool want_last, float* last_logits,
                     float* all_logits);
  // Runs one chunk and returns its logits rows in backend memory: every row when `all_rows`, else
  // the last when `want_last` (a decode step always computes its one row). `drafted`: a chunk of
  // at most kMaxDraftedRows with every row, DeltaNet a row at a time (one row is a decode step).
  Tensor chunk_logits(const int32_t* ids, int T, SequenceState& st, bool want_last, bool all_rows,
                      bool drafted = false);
  // The ops of a one-token step of st, built once per sequence in a row (the list names its state).
  const OpList& decode_ops(SequenceState& st);
  // The ops of a verify step: every row's logits of T <= kMaxDraftedRows tokens of st (a
  // speculative draft checked in one step), DeltaNet a row at a time when `drafted`. Recorded
  // like a decode step, as drafts come every step.
  const OpList& verify_ops(SequenceState& st, int T, bool drafted);
  static constexpr size_t kVerifyOpLists = 32;
  Tensor all_logits_buffer();

  const ModelConfig& config_;
  const ModelWeights& weights_;
  Backend& backend_;
  ForwardOptions options_;
  StepBuffers buffers_;  // scratch for max_chunk rows, allocated once
  Tensor logits_;        // [1, vocab]
  Tensor all_logits_;    // [max_chunk, vocab], allocated on first use (all-position dumps, batches)
  std::vector<int32_t> mixed_ids_;      // a mixed step's staged ids: the pieces', then the rows'
  std::vector<StepPiece> mixed_pieces_;  // and its pieces
  OpList decode_ops_;
  const SequenceState* decode_ops_for_ = nullptr;
  std::map<std::tuple<const SequenceState*, int, bool>, OpList> verify_ops_;  // by state, rows, drafted
  int trunk_rows_ = 0;  // rows of the last trunk step, whose residual rows buffers_.h holds
  MtpBuffers mtp_buffers_;
  Tensor mtp_logits_;   // [1, vocab]: the head's own, so a draft never overwrites logits a decoder kept
  int mtp_rows_ = 0;    // rows of the last head step
  const SequenceState* mtp_last_ = nullptr;  // the head state that step continued
};

}  // namespace petrel
