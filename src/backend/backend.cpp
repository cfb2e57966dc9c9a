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
                 [&](const op::Attention& a) {
                   const Tensor* gate = a.gate.data ? &a.gate : nullptr;
                   if (a.states.rows) attention_batch(a.q, a.k, a.v, gate, a.layer, a.states.rows, a.out);
                   else attention(a.q, a.k, a.v, gate, a.layer, *a.states.chunk, a.out);
                 },
                 [&](const op::DeltaNet& d) {
                   if (d.states.rows) deltanet_batch(d.qkv, d.z, d.b, d.a, *d.w, d.layer, d.states.rows, d.out);
                   else deltanet(d.qkv, d.z, d.b, d.a, *d.w, d.layer, *d.states.chunk, d.out);
                 },
                 [&](const op::Mlp& m) { mlp(m.x, *m.w, m.out); },
                 [&](const op::Moe& m) { moe(m.x, *m.w, m.out); },
                 [&](const op::Argmax& a) { argmax(a.logits); },
             },
             o);
}

}  // namespace petrel
