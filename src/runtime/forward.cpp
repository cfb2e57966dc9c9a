#include "runtime/forward.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace petrel {

Model::Model(const ModelConfig& config, const ModelWeights& weights, Backend& backend, const ForwardOptions& options)
    : config_(config), weights_(weights), backend_(backend), options_(options) {
  check(options_.max_chunk >= 1, "max_chunk must be at least 1");
  backend_.prepare(config_, weights_);
  backend_.reserve(options_.max_chunk);
  const int64_t T = options_.max_chunk;
  const ModelConfig& c = config_;
  StepBuffers& b = buffers_;
  b.h = backend_.alloc(T, c.hidden, /*fp32=*/true);  // residual stream: sums of many layers keep fp32
  b.x = backend_.alloc(T, c.hidden, /*fp32=*/true);  // norm output: routers see it unrounded
  b.mix = backend_.alloc(T, c.hidden);
  b.ffn = backend_.alloc(T, c.hidden);
  const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  b.q = backend_.alloc(T, q_width);
  if (c.attn_output_gate) b.gate = backend_.alloc(T, q_width);
  b.k = backend_.alloc(T, kv_width);
  b.v = backend_.alloc(T, kv_width);
  b.attn = backend_.alloc(T, q_width);
  if (c.hybrid()) {
    b.qkv = backend_.alloc(T, c.gdn_conv_channels());
    b.z = backend_.alloc(T, c.gdn_value_dim());
    b.b = backend_.alloc(T, c.lin_v_heads, /*fp32=*/true);  // the decay exp(-A·softplus(a)) amplifies rounding
    b.a = backend_.alloc(T, c.lin_v_heads, /*fp32=*/true);
    b.gdn = backend_.alloc(T, c.gdn_value_dim());
  }
  logits_ = backend_.alloc(1, c.vocab, /*fp32=*/true);
  if (has_mtp()) {
    mtp_buffers_.h = backend_.alloc(T, c.hidden, /*fp32=*/true);
    mtp_buffers_.concat = backend_.alloc(T, 2 * int64_t(c.hidden));
    mtp_logits_ = backend_.alloc(1, c.vocab, /*fp32=*/true);
  }
}

void Model::forward(const int32_t* ids, int n, SequenceState& st, float* last_logits, float* all_logits) {
  run_chunks(ids, n, st, last_logits != nullptr, last_logits, all_logits);
}

int32_t Model::forward_greedy(const int32_t* ids, int n, SequenceState& st) {
  run_chunks(ids, n, st, true, nullptr, nullptr);
  return backend_.greedy_token();
}

void Model::check_fits(int n, const SequenceState& st) const {
  check(n >= 1, "forward needs at least one token");
  check(st.n_past + n <= st.capacity, "context length exceeded: " + std::to_string(st.n_past) + " + " +
                                          std::to_string(n) + " tokens > capacity " + std::to_string(st.capacity));
}

void Model::run_chunks(const int32_t* ids, int n, SequenceState& st, bool want_last, float* last_logits,
                       float* all_logits) {
  check_fits(n, st);
  const int chunk = all_logits ? logit_rows() : options_.max_chunk;
  for (int done = 0; done < n;) {
    const int T = std::min(chunk, n - done);
    const bool last = done + T == n;
    forward_chunk(ids + done, T, st, last && want_last, last ? last_logits : nullptr,
                  all_logits ? all_logits + int64_t(done) * config_.vocab : nullptr);
    done += T;
  }
}

Tensor Model::forward_device(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) {
  check_fits(n, st);
  if (keep == KeepLogits::Drafted) {
    check(n <= kMaxDraftedRows && n <= logit_rows(),
          "forward_device: " + std::to_string(n) + " drafted tokens, more than the " +
              std::to_string(std::min(kMaxDraftedRows, logit_rows())) + " one step feeds");
    return chunk_logits(ids, n, st, /*want_last=*/false, /*all_rows=*/true, /*drafted=*/true);
  }
  check(keep != KeepLogits::All || n <= logit_rows(),
        "forward_device: every row's logits of " + std::to_string(n) + " tokens, more than the " +
            std::to_string(logit_rows()) + " logits rows a step keeps (ForwardOptions::logit_rows)");
  Tensor logits;
  for (int done = 0; done < n;) {
    const int T = std::min(options_.max_chunk, n - done);
    const bool last = done + T == n;
    logits = chunk_logits(ids + done, T, st, last && keep == KeepLogits::Last, last && keep == KeepLogits::All);
    done += T;
  }
  return keep == KeepLogits::None ? logits.rows_view(0, 0) : logits;
}

void Model::forward_chunk(const int32_t* ids, int T, SequenceState& st, bool want_last, float* last_logits,
                          float* all_logits) {
  const Tensor logits = chunk_logits(ids, T, st, want_last, all_logits != nullptr);
  if (all_logits) {
    backend_.to_host(logits, all_logits);
    if (last_logits)
      std::copy(all_logits + int64_t(T - 1) * config_.vocab, all_logits + int64_t(T) * config_.vocab, last_logits);
  } else if (last_logits) {
    backend_.to_host(logits, last_logits);
  }
}

Tensor Model::chunk_logits(const int32_t* ids, int T, SequenceState& st, bool want_last, bool all_rows,
                           bool drafted) {
  backend_.begin_forward(ids, T, st);
  trunk_rows_ = T;
  if (T == 1) {
    // A decode step always computes its logits into logits_ and queues their argmax (greedy
    // callers read it back): the step may be recorded once and replayed (CUDA graphs), so it must
    // not depend on what this particular caller wants; a sampled step pays the unread argmax.
    backend_.run(decode_ops(st), &st);
    st.n_past += 1;
    return logits_;
  }
  if (all_rows && T <= kMaxDraftedRows) {
    // Drafted steps are other ops than every-row chunks of as many rows: recorded apart.
    backend_.run(verify_ops(st, T, drafted), &st, /*variant=*/drafted ? 1 : 0);
    st.n_past += T;
    return all_logits_buffer().rows_view(0, T);
  }
  // Only the rows whose logits are wanted go through the final norm and the LM head.
  const int rows = all_rows ? T : want_last ? 1 : 0;
  const Tensor logits = (all_rows ? all_logits_buffer() : logits_).rows_view(0, rows);
  backend_.run(step_ops(config_, weights_, buffers_, {T, {&st, nullptr}, logits, /*argmax=*/want_last}));
  st.n_past += T;
  return logits;
}

const OpList& Model::decode_ops(SequenceState& st) {
  if (decode_ops_for_ != &st) {
    decode_ops_ = step_ops(config_, weights_, buffers_, {1, {&st, nullptr}, logits_, /*argmax=*/true});
    decode_ops_for_ = &st;
  }
  return decode_ops_;
}

const OpList& Model::verify_ops(SequenceState& st, int T, bool drafted) {
  const std::tuple<const SequenceState*, int, bool> key{&st, T, drafted};
  auto it = verify_ops_.find(key);
  if (it != verify_ops_.end()) return it->second;
  if (verify_ops_.size() >= kVerifyOpLists) verify_ops_.clear();  // states come and go; their lists are cheap
  StepShape shape{T, {&st, nullptr}, all_logits_buffer().rows_view(0, T), /*argmax=*/false};
  shape.rows_one_at_a_time = drafted;
  return verify_ops_[key] = step_ops(config_, weights_, buffers_, shape);
}

void Model::forward_batch(const int32_t* ids, SequenceState* const* seqs, int B, float* logits) {
  backend_.to_host(forward_batch_device(ids, seqs, B), logits);
}

void Model::check_rows(SequenceState* const* seqs, int B, int piece_rows) const {
  check(B >= 1 && B + piece_rows <= max_batch(),
        "forward_batch: " + std::to_string(B) + " sequences and " + std::to_string(piece_rows) +
            " prompt tokens, expected 1.." + std::to_string(max_batch()) + " rows in all (the prefill chunk length)");
  check(B <= logit_rows(), "forward_batch: " + std::to_string(B) + " sequences, more than the " +
                               std::to_string(logit_rows()) + " logits rows a step keeps (ForwardOptions::logit_rows)");
  for (int b = 0; b < B; ++b) {
    check(seqs[b]->n_past < seqs[b]->capacity, "forward_batch: sequence " + std::to_string(b) + " is full (" +
                                                   std::to_string(seqs[b]->capacity) + " tokens)");
    for (int other = 0; other < b; ++other)
      check(seqs[other] != seqs[b], "forward_batch: rows " + std::to_string(other) + " and " + std::to_string(b) +
                                        " continue the same sequence");
  }
}

Tensor Model::forward_batch_device(const int32_t* ids, SequenceState* const* seqs, int B) {
  check_rows(seqs, B, 0);
  // One row is a plain decode step: it can replay the sequence's recorded step (CUDA graphs).
  if (B == 1) return forward_device(ids, 1, *seqs[0], KeepLogits::Last);
  Tensor out = all_logits_buffer().rows_view(0, B);
  backend_.begin_batch(ids, seqs, B);
  trunk_rows_ = 0;  // rows of different sequences: no head step continues them as one
  backend_.run_batch(step_ops(config_, weights_, buffers_, {B, {nullptr, seqs}, out, /*argmax=*/false}));
  for (int b = 0; b < B; ++b) seqs[b]->n_past += 1;
  return out;
}

Tensor Model::forward_mixed_device(const int32_t* ids, SequenceState* const* seqs, int B,
                                   std::span<const PromptPiece> pieces) {
  if (pieces.empty()) return forward_batch_device(ids, seqs, B);
  mixed_ids_.clear();
  mixed_pieces_.clear();
  std::vector<int> kept;  // the rows whose logits come out
  for (const PromptPiece& p : pieces) {
    check(p.n >= 1 && p.state != nullptr && std::find(seqs, seqs + B, p.state) == seqs + B,
          "forward_mixed: a prompt piece must have tokens and continue a sequence of its own, not a decode row's");
    for (const StepPiece& other : mixed_pieces_)
      check(other.state != p.state, "forward_mixed: two prompt pieces continue the same sequence");
    check_fits(p.n, *p.state);
    mixed_ids_.insert(mixed_ids_.end(), p.ids, p.ids + p.n);
    if (p.keep_last) kept.push_back(int(mixed_ids_.size()) - 1);
    mixed_pieces_.push_back({p.state, p.n});
  }
  const int piece_rows = int(mixed_ids_.size());
  check(B >= 0 && piece_rows + B <= max_batch(), "forward_mixed: " + std::to_string(piece_rows) +
                                                     " prompt tokens and " + std::to_string(B) +
                                                     " rows, expected at most " + std::to_string(max_batch()));
  if (B > 0) check_rows(seqs, B, piece_rows);
  mixed_ids_.insert(mixed_ids_.end(), ids, ids + B);
  for (int b = 0; b < B; ++b) kept.push_back(piece_rows + b);
  check(int(kept.size()) <= logit_rows(),
        "forward_mixed: " + std::to_string(kept.size()) + " rows of logits, more than the " +
            std::to_string(logit_rows()) + " a step keeps (ForwardOptions::logit_rows)");
  Tensor out = all_logits_buffer().rows_view(0, int64_t(kept.size()));
  backend_.begin_batch(mixed_ids_.data(), seqs, B, mixed_pieces_.data(), int(mixed_pieces_.size()));
  trunk_rows_ = 0;
  const StepStates states{nullptr, B > 0 ? seqs : nullptr, mixed_pieces_.data(), int(mixed_pieces_.size())};
  StepShape shape{piece_rows + B, states, out, /*argmax=*/false};
  shape.logit_rows = std::move(kept);
  backend_.run(step_ops(config_, weights_, buffers_, shape));
  for (const PromptPiece& p : pieces) p.state->n_past += p.n;
  for (int b = 0; b < B; ++b) seqs[b]->n_past += 1;
  return out;
}

std::unique_ptr<SequenceState> Model::new_mtp_sequence(int capacity) {
  check(has_mtp(), "this checkpoint has no multi-token prediction head (mtp.* tensors)");
  return backend_.new_mtp_sequence(capacity);
}

int32_t Model::mtp_forward(const int32_t* ids, int n, bool from_trunk, SequenceState& mtp, float* all_logits) {
  check(has_mtp(), "this checkpoint has no multi-token prediction head (mtp.* tensors)");
  const int source_rows = from_trunk ? trunk_rows_ : mtp_rows_;
  check(n >= 1 && n <= source_rows && (from_trunk || n == 1),
        "mtp_forward: " + std::to_string(n) + " rows, but the " + (from_trunk ? "trunk" : "head") +
            "'s last step left " + std::to_string(source_rows));
  check(from_trunk || &mtp == mtp_last_,
        "mtp_forward: a chained step continues the last head step, which continued another head state");
  check(!all_logits || n <= logit_rows(), "mtp_forward: every row's logits of " + std::to_string(n) +
                                             " rows, more than the " + std::to_string(logit_rows()) + " a step keeps");
  check(mtp.n_past + n <= mtp.capacity, "mtp_forward: the head's cache holds " + std::to_string(mtp.capacity) +
                                            " tokens, " + std::to_string(mtp.n_past + n) + " needed");
  const MtpInput input = from_trunk ? MtpInput{buffers_.h, &weights_.final_norm}
                                    : MtpInput{mtp_buffers_.h.rows_view(mtp_rows_ - 1, 1), &weights_.mtp.norm};
  const Tensor logits = all_logits ? all_logits_buffer().rows_view(0, n) : mtp_logits_;
  // The head's steps repeat with the same shape every draft: recorded, apart for each input row
  // a chained step reads and for the logits rows it keeps.
  const int variant = 2 * (from_trunk ? 0 : mtp_rows_) + (all_logits ? 1 : 0);
  backend_.begin_forward(ids, n, mtp);
  backend_.run(mtp_step_ops(config_, weights_, buffers_, mtp_buffers_, input, {n, {&mtp, nullptr}, logits, true}),
               &mtp, variant);
  mtp.n_past += n;
  mtp_rows_ = n;
  mtp_last_ = &mtp;
  if (all_logits) backend_.to_host(logits, all_logits);
  return backend_.greedy_token();
}

Tensor Model::all_logits_buffer() {
  if (all_logits_.data == nullptr)  // only callers that want many logits rows pay for them
    all_logits_ = backend_.alloc(logit_rows(), config_.vocab, /*fp32=*/true);
  return all_logits_;
}

}  // namespace petrel
