// Which neighbouring ops of a step the CUDA backend runs as one: a pass over an op list that
// finds the patterns its fused kernels cover. Plain C++ (no CUDA), so tests run it anywhere.
#pragma once
#include <vector>

#include "model/ops.h"

namespace petrel::cuda {

enum class Group {
  Op,                   // one op on its own
  Linears,              // Linear ops reading one input: one pass over it
  NormLinears,          // RmsNorm, then Linear ops reading its output: the norm applied while staging
  LinearAdd,            // Linear, then Add of its output into h: the projection adds its rows itself
  NormMoeAdd,           // RmsNorm of h, Moe of the normed rows, Add into h
  LinearAddNormMoeAdd,  // LinearAdd, then NormMoeAdd of the same h: the router summed beside the projection
  NormRopeAttention,    // QkNormRope, then one sequence's Attention of the same q and k
};

// What the projections of a NormLinears group feed: a backend may start the mixer's step beside them.
enum class Feeds { Other, DeltaNet, Attention };

struct OpGroup {
  Group group = Group::Op;
  int first = 0, count = 1;  // ops[first .. first+count-1]
  Feeds feeds = Feeds::Other;
  bool argmax_follows = false;  // NormLinears of one Linear whose one output row the next op's Argmax reads
};

// At most this many Linear ops form one group.
constexpr int kMaxGroupedLinears = 8;

// The groups covering ops in order. A group is formed only where the tensors it leaves unwritten
// (a norm's output, a projection's output before the add, q and k before RoPE) are not read by a
// later op before being written again.
std::vector<OpGroup> group_ops(const OpList& ops);

}  // namespace petrel::cuda
