#include "backend/cuda/op_groups.h"

#include <algorithm>
#include <variant>

namespace petrel::cuda {
namespace {

// The bytes a tensor view spans.
struct Span {
  const char *begin = nullptr, *end = nullptr;
};
Span span(const Tensor& t) {
  const char* b = static_cast<const char*>(t.data);
  if (!b || t.rows == 0) return {};
  return {b, b + ((t.rows - 1) * t.stride + t.cols) * t.elem_size};
}

// The tensors an op reads and writes (at most four of each).
struct Access {
  Tensor reads[4], writes[2];
};
Access access(const Op& o) {
  struct Visitor {
    Access operator()(const op::Embed& e) const { return {{}, {e.out}}; }
    Access operator()(const op::RmsNorm& n) const { return {{n.x}, {n.out}}; }
    Access operator()(const op::Linear& l) const { return {{l.x}, {l.out}}; }
    Access operator()(const op::Add& a) const { return {{a.h, a.a}, {a.h}}; }
    Access operator()(const op::QkNormRope& r) const { return {{r.q, r.k}, {r.q, r.k}}; }
    Access operator()(const op::Attention& a) const { return {{a.q, a.k, a.v, a.gate}, {a.out}}; }
    Access operator()(const op::DeltaNet& d) const { return {{d.qkv, d.z, d.b, d.a}, {d.out}}; }
    Access operator()(const op::Mlp& m) const { return {{m.x}, {m.out}}; }
    Access operator()(const op::Moe& m) const { return {{m.x}, {m.out}}; }
    Access operator()(const op::Argmax& a) const { return {{a.logits}, {}}; }
  };
  return std::visit(Visitor{}, o);
}

// The same as byte spans, computed once per op.
struct Spans {
  Span reads[4], writes[2];
  int64_t write_strides[2] = {};
};
Spans spans(const Op& o) {
  const Access a = access(o);
  Spans s;
  for (int i = 0; i < 4; ++i) s.reads[i] = span(a.reads[i]);
  for (int i = 0; i < 2; ++i) {
    s.writes[i] = span(a.writes[i]);
    s.write_strides[i] = a.writes[i].stride;
  }
  return s;
}

bool overlaps(const Span& x, const Span& y) { return x.begin && y.begin && x.begin < y.end && y.begin < x.end; }

template <class T>
const T* at(const OpList& ops, size_t i) {
  return i < ops.size() ? std::get_if<T>(&ops[i]) : nullptr;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.stride == b.stride;
}

class Grouper {
 public:
  explicit Grouper(const OpList& ops) : ops_(ops) {
    spans_.reserve(ops.size());
    for (const Op& o : ops) spans_.push_back(spans(o));
  }

  std::vector<OpGroup> run() {
    groups_.reserve(ops_.size());
    for (size_t i = 0; i < ops_.size();) {
      const OpGroup g = match(i);
      groups_.push_back(g);
      i += size_t(g.count);
    }
    return std::move(groups_);
  }

 private:
  // The first pattern that starts at op i, longest first.
  OpGroup match(size_t i) const {
    using Matcher = OpGroup (Grouper::*)(size_t) const;
    for (Matcher m : {&Grouper::linear_add_norm_moe_add, &Grouper::linear_add, &Grouper::norm_moe_add,
                      &Grouper::norm_linears, &Grouper::linears, &Grouper::norm_rope_attention}) {
      const OpGroup g = (this->*m)(i);
      if (g.count > 0) return g;
    }
    return {Group::Op, int(i), 1};
  }

  static OpGroup none() { return {Group::Op, 0, 0}; }

  // True when no op from `from` on reads t before an op overwrites all of it.
  bool dead_after(size_t from, const Tensor& t) const {
    const Span ts = span(t);
    for (size_t i = from; i < spans_.size(); ++i) {
      const Spans& s = spans_[i];
      for (const Span& r : s.reads)
        if (overlaps(r, ts)) return false;
      for (int w = 0; w < 2; ++w)
        if (s.writes[w].begin && s.writes[w].begin <= ts.begin && ts.end <= s.writes[w].end &&
            s.write_strides[w] == t.stride)
          return true;
    }
    return true;
  }

  // Linear ops from i on reading `x`, at most kMaxGroupedLinears.
  int linears_reading(size_t i, const Tensor& x) const {
    int n = 0;
    while (n < kMaxGroupedLinears) {
      const op::Linear* l = at<op::Linear>(ops_, i + size_t(n));
      if (!l || !same(l->x, x)) break;
      ++n;
    }
    return n;
  }

  OpGroup linears(size_t i) const {
    const op::Linear* l = at<op::Linear>(ops_, i);
    const int n = l ? linears_reading(i, l->x) : 0;
    return n >= 2 ? OpGroup{Group::Linears, int(i), n} : none();
  }

  OpGroup norm_linears(size_t i) const {
    const op::RmsNorm* norm = at<op::RmsNorm>(ops_, i);
    if (!norm) return none();
    const int n = linears_reading(i + 1, norm->out);
    const size_t end = i + 1 + size_t(n);
    if (n == 0 || !dead_after(end, norm->out)) return none();
    OpGroup g{Group::NormLinears, int(i), 1 + n};
    if (at<op::QkNormRope>(ops_, end) || at<op::Attention>(ops_, end)) g.feeds = Feeds::Attention;
    else if (at<op::DeltaNet>(ops_, end)) g.feeds = Feeds::DeltaNet;
    const op::Argmax* arg = at<op::Argmax>(ops_, end);
    const op::Linear& last = std::get<op::Linear>(ops_[end - 1]);
    g.argmax_follows = n == 1 && arg && last.out.rows == 1 && same(arg->logits, last.out);
    return g;
  }

  // Linear(y → s), Add(h += s), s read no more.
  OpGroup linear_add(size_t i) const {
    const op::Linear* l = at<op::Linear>(ops_, i);
    const op::Add* add = at<op::Add>(ops_, i + 1);
    if (!l || !add || !same(add->a, l->out) || !dead_after(i + 2, l->out)) return none();
    return {Group::LinearAdd, int(i), 2};
  }

  // RmsNorm(h → x), Moe(x → f), Add(h += f), x and f read no more.
  OpGroup norm_moe_add(size_t i) const {
    const op::RmsNorm* norm = at<op::RmsNorm>(ops_, i);
    const op::Moe* moe = at<op::Moe>(ops_, i + 1);
    const op::Add* add = at<op::Add>(ops_, i + 2);
    if (!norm || !moe || !add || !same(moe->x, norm->out) || !same(add->h, norm->x) || !same(add->a, moe->out) ||
        !dead_after(i + 3, norm->out) || !dead_after(i + 3, moe->out))
      return none();
    return {Group::NormMoeAdd, int(i), 3};
  }

  OpGroup linear_add_norm_moe_add(size_t i) const {
    if (linear_add(i).count == 0 || norm_moe_add(i + 2).count == 0) return none();
    const op::Add& add = std::get<op::Add>(ops_[i + 1]);
    const op::RmsNorm& norm = std::get<op::RmsNorm>(ops_[i + 2]);
    if (!same(norm.x, add.h)) return none();
    return {Group::LinearAddNormMoeAdd, int(i), 5};
  }

  // QkNormRope(q, k), Attention(q, k, ...) of one sequence, q and k read no more.
  OpGroup norm_rope_attention(size_t i) const {
    const op::QkNormRope* r = at<op::QkNormRope>(ops_, i);
    const op::Attention* a = at<op::Attention>(ops_, i + 1);
    if (!r || !a || !a->states.chunk || a->states.rows || !same(a->q, r->q) || !same(a->k, r->k) ||
        !dead_after(i + 2, r->q) || !dead_after(i + 2, r->k))
      return none();
    return {Group::NormRopeAttention, int(i), 2};
  }

  const OpList& ops_;
  std::vector<Spans> spans_;  // per op
  std::vector<OpGroup> groups_;
};

}  // namespace

std::vector<OpGroup> group_ops(const OpList& ops) { return Grouper(ops).run(); }

}  // namespace petrel::cuda
