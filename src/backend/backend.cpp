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

// A mixed step runs its piece's rows as a chunk of that sequence, then the rest as a batch.
void Backend::run_attention(const op::Attention& a) {
  const StepStates& s = a.states;
  const int64_t n = s.rows ? s.chunk_rows : a.q.rows, rest = a.q.rows - n;
  const auto part = [](const Tensor& t, int64_t r0, int64_t rows) { return t.data ? t.rows_view(r0, rows) : t; };
  if (n > 0) {
    const Tensor gate = part(a.gate, 0, n);
    attention(part(a.q, 0, n), part(a.k, 0, n), part(a.v, 0, n), gate.data ? &gate : nullptr, a.layer, *s.chunk,
              part(a.out, 0, n));
  }
  if (rest > 0) {
    const Tensor gate = part(a.gate, n, rest);
    attention_batch(part(a.q, n, rest), part(a.k, n, rest), part(a.v, n, rest), gate.data ? &gate : nullptr, a.layer,
                    s.rows, part(a.out, n, rest));
  }
}

void Backend::run_deltanet(const op::DeltaNet& d) {
  const StepStates& s = d.states;
  const int64_t n = s.rows ? s.chunk_rows : d.qkv.rows, rest = d.qkv.rows - n;
  if (n > 0)
    deltanet(d.qkv.rows_view(0, n), d.z.rows_view(0, n), d.b.rows_view(0, n), d.a.rows_view(0, n), *d.w, d.layer,
             *s.chunk, d.out.rows_view(0, n));
  if (rest > 0)
    deltanet_batch(d.qkv.rows_view(n, rest), d.z.rows_view(n, rest), d.b.rows_view(n, rest), d.a.rows_view(n, rest),
                   *d.w, d.layer, s.rows, d.out.rows_view(n, rest));
}

}  // namespace petrel
