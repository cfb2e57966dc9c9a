#include "model/forward.h"

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
  ws_.h = backend_.alloc(T, c.hidden, /*fp32=*/true);  // residual stream: sums of many layers keep fp32
  ws_.x = backend_.alloc(T, c.hidden, /*fp32=*/true);  // norm output: routers see it unrounded
  ws_.mix = backend_.alloc(T, c.hidden);
  ws_.ffn = backend_.alloc(T, c.hidden);
  const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  ws_.q = backend_.alloc(T, q_width);
  if (c.attn_output_gate) ws_.gate = backend_.alloc(T, q_width);
  ws_.k = backend_.alloc(T, kv_width);
  ws_.v = backend_.alloc(T, kv_width);
  ws_.attn = backend_.alloc(T, q_width);
  if (c.hybrid()) {
    ws_.qkv = backend_.alloc(T, c.gdn_conv_channels());
    ws_.z = backend_.alloc(T, c.gdn_value_dim());
    ws_.b = backend_.alloc(T, c.lin_v_heads, /*fp32=*/true);  // the decay exp(-A·softplus(a)) amplifies rounding
    ws_.a = backend_.alloc(T, c.lin_v_heads, /*fp32=*/true);
    ws_.gdn = backend_.alloc(T, c.gdn_value_dim());
  }
  ws_.logits = backend_.alloc(1, c.vocab, /*fp32=*/true);
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
  for (int done = 0; done < n;) {
    const int T = std::min(options_.max_chunk, n - done);
    const bool last = done + T == n;
    forward_chunk(ids + done, T, st, last && want_last, last ? last_logits : nullptr,
                  all_logits ? all_logits + int64_t(done) * config_.vocab : nullptr);
    done += T;
  }
}

Tensor Model::forward_device(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) {
  check_fits(n, st);
  check(keep != KeepLogits::All || n <= options_.max_chunk,
        "forward_device: every row's logits of " + std::to_string(n) + " tokens, more than a chunk of " +
            std::to_string(options_.max_chunk));
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

Tensor Model::chunk_logits(const int32_t* ids, int T, SequenceState& st, bool want_last, bool all_rows) {
  // A decode step always computes its logits into ws_.logits: the step may be recorded once and
  // replayed (CUDA graphs), so it must not depend on what this particular caller wants.
  const bool decode = T == 1;
  // Otherwise only the rows whose logits are wanted go through the final norm and the LM head.
  const int first = decode || all_rows ? 0 : (want_last ? T - 1 : T);
  Tensor logits = (all_rows && !decode ? all_logits_buffer() : ws_.logits).rows_view(0, T - first);
  backend_.begin_forward(ids, T, st);
  // The last row's argmax rides along (greedy callers read it back); a decode step always queues
  // it, inside the ops a backend may record, so one recording serves greedy and sampling callers
  // alike (a sampled step pays the unread argmax: a few microseconds). The backend hears of it
  // before the LM head, which may take its first stage.
  const bool argmax = decode || want_last;
  const auto last = [&] { return logits.rows_view(logits.rows - 1, 1); };
  auto ops = [&] {
    if (argmax) backend_.expect_argmax(last());
    compute_chunk(T, StepStates{&st, nullptr}, first, logits);
    if (argmax) backend_.queue_argmax(last());
  };
  if (decode) backend_.run_decode_step(st, ops);
  else ops();
  st.n_past += T;
  return logits;
}

void Model::forward_batch(const int32_t* ids, SequenceState* const* seqs, int B, float* logits) {
  backend_.to_host(forward_batch_device(ids, seqs, B), logits);
}

Tensor Model::forward_batch_device(const int32_t* ids, SequenceState* const* seqs, int B) {
  check(B >= 1 && B <= max_batch(), "forward_batch: " + std::to_string(B) + " sequences, expected 1.." +
                                        std::to_string(max_batch()) + " (the prefill chunk length)");
  for (int b = 0; b < B; ++b) {
    check(seqs[b]->n_past < seqs[b]->capacity, "forward_batch: sequence " + std::to_string(b) + " is full (" +
                                                   std::to_string(seqs[b]->capacity) + " tokens)");
    for (int other = 0; other < b; ++other)
      check(seqs[other] != seqs[b], "forward_batch: rows " + std::to_string(other) + " and " + std::to_string(b) +
                                        " continue the same sequence");
  }
  // One row is a plain decode step: it can replay the sequence's recorded step (CUDA graphs).
  if (B == 1) return forward_device(ids, 1, *seqs[0], KeepLogits::Last);
  Tensor out = all_logits_buffer().rows_view(0, B);
  backend_.begin_batch(ids, seqs, B);
  compute_chunk(B, StepStates{nullptr, seqs}, 0, out);
  for (int b = 0; b < B; ++b) seqs[b]->n_past += 1;
  return out;
}

Tensor Model::all_logits_buffer() {
  if (ws_.all_logits.data == nullptr)  // only callers that want many logits rows pay for them
    ws_.all_logits = backend_.alloc(options_.max_chunk, config_.vocab, /*fp32=*/true);
  return ws_.all_logits;
}

void Model::compute_chunk(int T, const StepStates& st, int first_logit_row, Tensor logits) {
  const ModelConfig& c = config_;
  Tensor h = ws_.h.rows_view(0, T), x = ws_.x.rows_view(0, T);
  Tensor mix = ws_.mix.rows_view(0, T), ffn = ws_.ffn.rows_view(0, T);
  backend_.embed(weights_.embed, h);
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& L = weights_.layers[i];
    if (T == 1 && st.chunk && L.kind == LayerKind::DeltaNet && L.ffn.moe &&
        backend_.deltanet_moe_layer(i, L, c.rms_eps, h, deltanet_scratch(1), *st.chunk))
      continue;
    const Mixed m = L.kind == LayerKind::DeltaNet ? deltanet_mixer(i, h, x, st) : attention_mixer(i, h, x, st);
    if (L.ffn.moe) {
      backend_.linear_add_moe_add(m.y, *m.out, h, mix, L.post_norm, c.rms_eps, x, L.ffn, ffn);
    } else {
      backend_.linear_add(m.y, *m.out, h, mix);
      backend_.rms_norm(h, L.post_norm, c.rms_eps, x);
      backend_.mlp(x, L.ffn.dense, ffn);
      backend_.add(h, ffn);
    }
  }
  if (first_logit_row == T) return;
  Tensor hs = h.rows_view(first_logit_row, T - first_logit_row), xs = x.rows_view(first_logit_row, T - first_logit_row);
  const Matrix* head[] = {&weights_.lm_head};
  backend_.rms_norm_linear_many(hs, weights_.final_norm, c.rms_eps, xs, head, &logits, 1);
}

Model::Mixed Model::attention_mixer(int layer, Tensor h, Tensor x, const StepStates& st) {
  const AttentionWeights& A = weights_.layers[layer].attn;
  const int64_t T = x.rows;
  Tensor q = ws_.q.rows_view(0, T), k = ws_.k.rows_view(0, T), v = ws_.v.rows_view(0, T);
  Tensor attn = ws_.attn.rows_view(0, T);
  Tensor gate = A.gate.valid() ? ws_.gate.rows_view(0, T) : Tensor{};
  const Matrix* proj[] = {&A.q, &A.k, &A.v, &A.gate};
  const Tensor proj_out[] = {q, k, v, gate};
  backend_.rms_norm_linear_many(h, weights_.layers[layer].input_norm, config_.rms_eps, x, proj, proj_out,
                                A.gate.valid() ? 4 : 3, Backend::Feeds::Attention);
  const Tensor* gate_or_null = A.gate.valid() ? &gate : nullptr;
  if (st.rows) {
    backend_.qk_norm_rope(q, k, A);
    backend_.attention_batch(q, k, v, gate_or_null, layer, st.rows, attn);
  } else {
    backend_.qk_norm_rope_attention(q, k, v, gate_or_null, A, layer, *st.chunk, attn);
  }
  return {attn, &A.o};
}

Backend::DeltaNetScratch Model::deltanet_scratch(int64_t T) const {
  return {ws_.qkv.rows_view(0, T), ws_.z.rows_view(0, T), ws_.b.rows_view(0, T), ws_.a.rows_view(0, T),
          ws_.gdn.rows_view(0, T)};
}

Model::Mixed Model::deltanet_mixer(int layer, Tensor h, Tensor x, const StepStates& st) {
  const DeltaNetWeights& G = weights_.layers[layer].gdn;
  const auto [qkv, z, b, a, o] = deltanet_scratch(x.rows);
  const Matrix* proj[] = {&G.qkv, &G.z, &G.b, &G.a};
  const Tensor proj_out[] = {qkv, z, b, a};
  backend_.rms_norm_linear_many(h, weights_.layers[layer].input_norm, config_.rms_eps, x, proj, proj_out, 4,
                                Backend::Feeds::DeltaNet);
  if (st.rows) backend_.deltanet_batch(qkv, z, b, a, G, layer, st.rows, o);
  else backend_.deltanet(qkv, z, b, a, G, layer, *st.chunk, o);
  return {o, &G.out};
}

}  // namespace petrel
