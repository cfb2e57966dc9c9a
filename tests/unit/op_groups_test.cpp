// Which ops of a step the CUDA backend runs as one (backend/cuda/op_groups.h): the grouping is
// plain C++, so its rules are checked here on the op lists the model writes, without a GPU.
#include "backend/cuda/op_groups.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/step_ops.h"
#include "model/synthetic.h"

namespace petrel {
namespace {

using cuda::Feeds;
using cuda::Group;
using cuda::OpGroup;

// Tensors at distinct, never dereferenced addresses: grouping reads only where tensors lie.
class FakeMemory {
 public:
  Tensor alloc(int64_t rows, int64_t cols, int elem_size = 2) {
    Tensor t{reinterpret_cast<void*>(next_), rows, cols, cols, elem_size};
    next_ += uintptr_t(rows * cols * elem_size + 256);
    return t;
  }

 private:
  uintptr_t next_ = 0x100000;
};

struct Step {
  ModelConfig c = synthetic_config("qwen3.5-35b-a3b");
  std::unique_ptr<ModelWeights> w = synthetic_weights(c);
  FakeMemory mem;
  StepBuffers b;
  Tensor logits;

  explicit Step(int rows) {
    b.h = mem.alloc(rows, c.hidden, 4);
    b.x = mem.alloc(rows, c.hidden, 4);
    b.mix = mem.alloc(rows, c.hidden);
    b.ffn = mem.alloc(rows, c.hidden);
    b.q = mem.alloc(rows, c.n_heads * c.head_dim);
    b.gate = mem.alloc(rows, c.n_heads * c.head_dim);
    b.k = mem.alloc(rows, c.n_kv_heads * c.head_dim);
    b.v = mem.alloc(rows, c.n_kv_heads * c.head_dim);
    b.attn = mem.alloc(rows, c.n_heads * c.head_dim);
    b.qkv = mem.alloc(rows, c.gdn_conv_channels());
    b.z = mem.alloc(rows, c.gdn_value_dim());
    b.b = mem.alloc(rows, c.lin_v_heads, 4);
    b.a = mem.alloc(rows, c.lin_v_heads, 4);
    b.gdn = mem.alloc(rows, c.gdn_value_dim());
    logits = mem.alloc(rows, c.vocab, 4);
  }
};

std::string describe(const OpGroup& g) {
  return "group " + std::to_string(int(g.group)) + " at op " + std::to_string(g.first) + " of " +
         std::to_string(g.count);
}

// A one-token step of the hybrid MoE model: per DeltaNet layer the input norm folded into its four
// projections (feeding the DeltaNet step), the step, then the output projection, norm, MoE and
// both adds as one; per attention layer the same with the norm + RoPE + attention as one; the LM
// head's norm folded in with the argmax after it.
TEST(OpGroups, DecodeStepOfTheHybridModel) {
  Step s(1);
  SequenceState* st = reinterpret_cast<SequenceState*>(0x40);
  const OpList ops = step_ops(s.c, *s.w, s.b, {1, {st, nullptr}, s.logits.rows_view(0, 1), /*argmax=*/true});
  const std::vector<OpGroup> groups = cuda::group_ops(ops);
  std::vector<OpGroup> want = {{Group::Op, 0, 1}};
  int at = 1;
  for (int i = 0; i < s.c.n_layers; ++i) {
    if (s.c.layer_kinds[i] == LayerKind::DeltaNet) {
      want.push_back({Group::NormLinears, at, 5, Feeds::DeltaNet});
      want.push_back({Group::Op, at + 5, 1});
      want.push_back({Group::LinearAddNormMoeAdd, at + 6, 5});
      at += 11;
    } else {
      want.push_back({Group::NormLinears, at, 5, Feeds::Attention});
      want.push_back({Group::NormRopeAttention, at + 5, 2});
      want.push_back({Group::LinearAddNormMoeAdd, at + 7, 5});
      at += 12;
    }
  }
  want.push_back({Group::NormLinears, at, 2, Feeds::Other, /*argmax_follows=*/true});
  want.push_back({Group::Op, at + 2, 1});
  ASSERT_EQ(at + 3, int(ops.size()));
  ASSERT_EQ(groups.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const OpGroup &g = groups[i], &e = want[i];
    EXPECT_TRUE(g.group == e.group && g.first == e.first && g.count == e.count && g.feeds == e.feeds &&
                g.argmax_follows == e.argmax_follows)
        << "got " << describe(g) << ", expected " << describe(e);
  }
}

// A batched step attends over each row's own sequence: RoPE and attention stay apart; a prefill
// chunk's LM head without an argmax has none to announce.
TEST(OpGroups, BatchedStepKeepsAttentionApart) {
  Step s(4);
  SequenceState* rows[4] = {};
  const OpList ops = step_ops(s.c, *s.w, s.b, {4, {nullptr, rows}, s.logits.rows_view(0, 4), /*argmax=*/false});
  int attention = 0;
  for (const OpGroup& g : cuda::group_ops(ops)) {
    EXPECT_NE(g.group, Group::NormRopeAttention) << describe(g);
    EXPECT_FALSE(g.argmax_follows) << describe(g);
    if (g.group == Group::Op && std::holds_alternative<op::Attention>(ops[size_t(g.first)])) ++attention;
  }
  EXPECT_EQ(attention, s.c.count(LayerKind::FullAttention));
}

// A drafted verify step (StepShape::rows_one_at_a_time) takes each DeltaNet layer's rows one at a
// time: one one-row op per row, in order, each reading and writing its own row, and each its own
// launch; the output projection and MoE after them still cover every row.
TEST(OpGroups, DraftedRowsTakeDeltaNetOneAtATime) {
  constexpr int kRows = 3;
  Step s(kRows);
  SequenceState* st = reinterpret_cast<SequenceState*>(0x40);
  StepShape shape{kRows, {st, nullptr}, s.logits.rows_view(0, kRows), /*argmax=*/false};
  shape.rows_one_at_a_time = true;
  const OpList ops = step_ops(s.c, *s.w, s.b, shape);
  std::vector<const op::DeltaNet*> steps;
  for (const Op& o : ops)
    if (const auto* d = std::get_if<op::DeltaNet>(&o)) steps.push_back(d);
  ASSERT_EQ(int(steps.size()), kRows * s.c.count(LayerKind::DeltaNet));
  for (size_t i = 0; i < steps.size(); ++i) {
    const op::DeltaNet& d = *steps[i];
    const int64_t row = int64_t(i % kRows);
    EXPECT_EQ(d.qkv.rows, 1);
    EXPECT_EQ(d.qkv.data, s.b.qkv.rows_view(row, 1).data) << "op " << i;
    EXPECT_EQ(d.b.data, s.b.b.rows_view(row, 1).data) << "op " << i;
    EXPECT_EQ(d.out.data, s.b.gdn.rows_view(row, 1).data) << "op " << i;
    EXPECT_EQ(d.states.chunk, st);
  }
  for (const OpGroup& g : cuda::group_ops(ops)) {
    if (std::holds_alternative<op::DeltaNet>(ops[size_t(g.first)])) {
      EXPECT_EQ(g.group, Group::Op) << describe(g);
    }
    if (g.group == Group::LinearAddNormMoeAdd) {
      EXPECT_EQ(std::get<op::Linear>(ops[size_t(g.first)]).x.rows, kRows) << describe(g);
    }
  }
  shape.rows_one_at_a_time = false;
  int chunked = 0;
  for (const Op& o : step_ops(s.c, *s.w, s.b, shape)) chunked += std::holds_alternative<op::DeltaNet>(o);
  EXPECT_EQ(chunked, s.c.count(LayerKind::DeltaNet));
}

// A tensor a fused form leaves unwritten must not be read later: a norm whose output another op
// reads after the projections keeps its own launch, and so does a projection whose output is read
// after the add.
TEST(OpGroups, NoGroupWhereALaterOpReadsWhatItSkips) {
  Step s(1);
  const LayerWeights& L = s.w->layers[0];
  const Tensor h = s.b.h, x = s.b.x, qkv = s.b.qkv, mix = s.b.mix, ffn = s.b.ffn;
  const OpList norm_read_later = {op::RmsNorm{h, &L.input_norm, 1e-6f, x}, op::Linear{x, &L.gdn.qkv, qkv},
                                  op::Moe{x, &L.ffn, ffn}};
  std::vector<OpGroup> g = cuda::group_ops(norm_read_later);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].group, Group::Op);

  const OpList norm_overwritten = {op::RmsNorm{h, &L.input_norm, 1e-6f, x}, op::Linear{x, &L.gdn.qkv, qkv},
                                   op::RmsNorm{h, &L.post_norm, 1e-6f, x}, op::Moe{x, &L.ffn, ffn}};
  g = cuda::group_ops(norm_overwritten);
  ASSERT_GE(g.size(), 1u);
  EXPECT_EQ(g[0].group, Group::NormLinears);

  const OpList projection_read_later = {op::Linear{s.b.gdn, &L.gdn.out, mix}, op::Add{h, mix},
                                        op::Add{s.b.ffn, mix}};
  g = cuda::group_ops(projection_read_later);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].group, Group::Op);
  // Only the overlap counts: a later read of another row of the same buffer keeps the group apart too.
  Step two(2);
  const OpList row_read_later = {op::Linear{two.b.gdn.rows_view(0, 1), &L.gdn.out, two.b.mix.rows_view(0, 1)},
                                 op::Add{two.b.h.rows_view(0, 1), two.b.mix.rows_view(0, 1)},
                                 op::Add{two.b.ffn.rows_view(1, 1), two.b.mix.rows_view(1, 1)}};
  g = cuda::group_ops(row_read_later);
  EXPECT_EQ(g[0].group, Group::LinearAdd) << "row 1 of mix is not what the projection wrote";
}

}  // namespace
}  // namespace petrel
