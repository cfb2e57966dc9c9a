#include "backend/backend.h"

#include <variant>

namespace petrel {
namespace {

template <class... Fs>
struct Overloads : Fs... {
  using Fs::operator()...;
};

}  // namespace

void Backend::run_op(const Op& o) {
  std::visit(Overloads{
                 [&](const op::Embed& e) { embed(*e.table, e.out); },
                 [&](const op::RmsNorm& n) { rms_norm(n.x, *n.w, n.eps, n.out); },
                 [&](const op::Linear& l) { linear(l.x, *l.w, l.out); },
                 [&](const op::Add& a) { add(a.h, a.a); },
                 [&](const op::QkNormRope& r) { qk_norm_rope(r.q, r.k, *r.w); },
                 [&](const op::Attention& a) { run_attention(a); },
                 [&](const op::DeltaNet& d) { run_deltanet(d); },
                 [&](const op::Mlp& m) { mlp(m.x, *m.w, m.out); },
                 [&](const op::Moe& m) { moe(m.x, *m.w, m.out); },
                 [&](const op::Argmax& a) { argmax(a.logits); },
             },
             o);
}

namespace {

// The rows of a step each state continues: a chunk's all, else each piece's in turn, then the
// decode rows' (the rest).
template <class Piece, class Rows>
void for_each_part(const StepStates& s, int64_t rows, Piece&& piece, Rows&& batch) {
  if (s.chunk && !s.rows && s.n_pieces == 0) return piece(*s.chunk, int64_t(0), rows);
  int64_t r0 = 0;
  for (int i = 0; i < s.n_pieces; ++i) {
    piece(*s.pieces[i].state, r0, int64_t(s.pieces[i].rows));
    r0 += s.pieces[i].rows;
  }
  if (rows > r0) batch(r0, rows - r0);
}

}  // namespace

// A mixed step runs each piece's rows as a chunk of its sequence, then the rest as a batch.
void Backend::run_attention(const op::Attention& a) {
  const auto part = [](const Tensor& t, int64_t r0, int64_t rows) { return t.data ? t.rows_view(r0, rows) : t; };
  for_each_part(
      a.states, a.q.rows,
      [&](SequenceState& st, int64_t r0, int64_t n) {
        const Tensor gate = part(a.gate, r0, n);
        attention(part(a.q, r0, n), part(a.k, r0, n), part(a.v, r0, n), gate.data ? &gate : nullptr, a.layer, st,
                  part(a.out, r0, n));
      },
      [&](int64_t r0, int64_t n) {
        const Tensor gate = part(a.gate, r0, n);
        attention_batch(part(a.q, r0, n), part(a.k, r0, n), part(a.v, r0, n), gate.data ? &gate : nullptr, a.layer,
                        a.states.rows, part(a.out, r0, n));
      });
}

void Backend::run_deltanet(const op::DeltaNet& d) {
  for_each_part(
      d.states, d.qkv.rows,
      [&](SequenceState& st, int64_t r0, int64_t n) {
        deltanet(d.qkv.rows_view(r0, n), d.z.rows_view(r0, n), d.b.rows_view(r0, n), d.a.rows_view(r0, n), *d.w,
                 d.layer, st, d.out.rows_view(r0, n));
      },
      [&](int64_t r0, int64_t n) {
        deltanet_batch(d.qkv.rows_view(r0, n), d.z.rows_view(r0, n), d.b.rows_view(r0, n), d.a.rows_view(r0, n),
                       *d.w, d.layer, d.states.rows, d.out.rows_view(r0, n));
      });
}

}  // namespace petrel
