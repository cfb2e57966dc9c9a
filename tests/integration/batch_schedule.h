// The decode schedule both batched-decode tests (CPU and GPU) run: five sequences with prompts of
// 3 to 71 tokens join and leave the batch between steps, in an order other than the one they were
// created in, and every row of each batched step is compared with a one-sequence step of the same
// sequence on a second set of states (allocated in turn with the batched ones, so that the states
// of one layer interleave in memory).
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/forward.h"

namespace petrel::test {

constexpr int kScheduleCapacity = 128;

inline std::vector<int32_t> schedule_prompt(int seq, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < 3 + 17 * seq; ++i) p.push_back((i * 31 + seq * 7 + 5) % vocab);
  return p;
}

inline int32_t argmax_of(const std::vector<float>& row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// Sequence 0 is in every step; 1 joins at step 2; 2 leaves after step 2; 3 takes every other
// step; 4 joins at step 1 and leaves after step 4.
inline bool in_step(int seq, int step) {
  switch (seq) {
    case 0: return true;
    case 1: return step >= 2;
    case 2: return step <= 2;
    case 3: return step % 2 == 0;
    default: return step >= 1 && step <= 4;
  }
}

// The even-indexed members, then the odd-indexed ones.
inline std::vector<int> every_other_first(const std::vector<int>& members) {
  std::vector<int> out;
  for (size_t i = 0; i < members.size(); i += 2) out.push_back(members[i]);
  for (size_t i = 1; i < members.size(); i += 2) out.push_back(members[i]);
  return out;
}

// compare(batched_row, alone_row, step, seq) for every row of `steps` steps; returns the number
// of rows compared. Both runs feed the lone run's greedy token, so their inputs never differ.
using RowCheck = std::function<void(const std::vector<float>&, const std::vector<float>&, int, int)>;
inline int run_schedule(Model& model, int steps, const RowCheck& compare) {
  constexpr int kSequences = 5;
  const int V = model.config().vocab;
  std::vector<std::unique_ptr<SequenceState>> alone, batched;
  std::vector<int32_t> next;
  std::vector<float> row(static_cast<size_t>(V));
  for (int s = 0; s < kSequences; ++s) {
    const std::vector<int32_t> p = schedule_prompt(s, V);
    alone.push_back(model.new_sequence(kScheduleCapacity));
    batched.push_back(model.new_sequence(kScheduleCapacity));
    model.forward(p.data(), int(p.size()), *alone.back(), row.data());
    model.forward(p.data(), int(p.size()), *batched.back(), nullptr);
    next.push_back(argmax_of(row));
  }
  int rows = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<int> members;
    for (int s = 0; s < kSequences; ++s)
      if (in_step(s, step)) members.push_back(s);
    // A row's place must not matter: odd steps reverse the members, even ones take every other
    // member, then the rest (step 2 batches all five as 0, 2, 4, 1, 3).
    if (step % 2 == 1) std::reverse(members.begin(), members.end());
    else members = every_other_first(members);
    std::vector<int32_t> ids;
    std::vector<SequenceState*> states;
    for (int s : members) {
      ids.push_back(next[size_t(s)]);
      states.push_back(batched[size_t(s)].get());
    }
    std::vector<float> logits(members.size() * size_t(V));
    model.forward_batch(ids.data(), states.data(), int(members.size()), logits.data());
    for (size_t b = 0; b < members.size(); ++b) {
      const int s = members[b];
      model.forward(&next[size_t(s)], 1, *alone[size_t(s)], row.data());
      compare(std::vector<float>(logits.begin() + b * V, logits.begin() + (b + 1) * V), row, step, s);
      next[size_t(s)] = argmax_of(row);
      ++rows;
    }
  }
  return rows;
}

// Prompts read in pieces, several in one step, beside the decode rows of sequences 0-2 and
// without them; every logits row is compared with the same pieces and steps run one sequence at a
// time on a second set of states: compare(mixed_row, alone_row, step, seq). Step 0 carries 37
// tokens of 3's prompt and 20 of 4's beside the rows; step 1 the rest of both, each ending its
// prompt (two logits rows that are not neighbours), beside the rows; step 2 no rows: all of 5's
// prompt, then 11 tokens of 6's. Step 3 decodes sequences 0-5 together. Returns the rows compared.
inline int run_mixed(Model& model, const RowCheck& compare) {
  constexpr int kDecoders = 3, kSequences = 7, kDecodedLast = 6;
  const int V = model.config().vocab;
  std::vector<std::unique_ptr<SequenceState>> alone, mixed;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> next(kSequences, 0);
  std::vector<float> row(static_cast<size_t>(V));
  for (int s = 0; s < kSequences; ++s) {
    alone.push_back(model.new_sequence(kScheduleCapacity));
    mixed.push_back(model.new_sequence(kScheduleCapacity));
    prompts.push_back(schedule_prompt(s, V));
    if (s >= kDecoders) continue;
    const std::vector<int32_t>& p = prompts.back();
    model.forward(p.data(), int(p.size()), *alone.back(), row.data());
    model.forward(p.data(), int(p.size()), *mixed.back(), nullptr);
    next[size_t(s)] = argmax_of(row);
  }
  struct Piece {
    int seq, begin, end;
  };
  const auto whole = [&](int s) { return int(prompts[size_t(s)].size()); };
  const std::vector<std::vector<Piece>> steps = {
      {{3, 0, 37}, {4, 0, 20}}, {{3, 37, whole(3)}, {4, 20, whole(4)}}, {{5, 0, whole(5)}, {6, 0, 11}}};
  std::vector<float> logits;
  int rows = 0;
  const auto check_row = [&](int r, int step, int s, const std::vector<float>& want) {
    compare(std::vector<float>(logits.begin() + r * V, logits.begin() + (r + 1) * V), want, step, s);
    ++rows;
  };
  for (int step = 0; step < int(steps.size()); ++step) {
    const int B = step < 2 ? kDecoders : 0;
    std::vector<Model::PromptPiece> pieces;
    for (const Piece& p : steps[size_t(step)])
      pieces.push_back({prompts[size_t(p.seq)].data() + p.begin, p.end - p.begin, mixed[size_t(p.seq)].get(),
                        p.end == whole(p.seq)});
    std::vector<SequenceState*> states;
    for (int s = 0; s < B; ++s) states.push_back(mixed[size_t(s)].get());
    const Tensor out = model.forward_mixed_device(next.data(), states.data(), B, pieces);
    logits.resize(size_t(out.rows) * size_t(V));
    model.backend().to_host(out, logits.data());
    int r = 0;  // logits rows: each piece that ends its prompt, then the decode rows
    for (const Model::PromptPiece& p : pieces) {
      const int s = int(std::find_if(mixed.begin(), mixed.end(), [&](const auto& m) { return m.get() == p.state; }) -
                        mixed.begin());
      model.forward(p.ids, p.n, *alone[size_t(s)], p.keep_last ? row.data() : nullptr);
      if (!p.keep_last) continue;
      check_row(r++, step, s, row);
      next[size_t(s)] = argmax_of(row);
    }
    for (int s = 0; s < B; ++s) {
      model.forward(&next[size_t(s)], 1, *alone[size_t(s)], row.data());
      check_row(r++, step, s, row);
      next[size_t(s)] = argmax_of(row);
    }
  }
  std::vector<SequenceState*> states;
  for (int s = 0; s < kDecodedLast; ++s) states.push_back(mixed[size_t(s)].get());
  logits.resize(size_t(kDecodedLast) * size_t(V));
  model.forward_batch(next.data(), states.data(), kDecodedLast, logits.data());
  for (int s = 0; s < kDecodedLast; ++s) {
    model.forward(&next[size_t(s)], 1, *alone[size_t(s)], row.data());
    check_row(s, int(steps.size()), s, row);
  }
  return rows;
}

// Logits of one prompt and of the decode step after it, on a state that served another sequence
// (one decode step included) and was reset, then on a fresh state: {used prefill, used step,
// fresh prefill, fresh step}. `used` and `fresh` are left holding the second sequence.
inline std::vector<std::vector<float>> reset_versus_fresh(Model& model, SequenceState& used, SequenceState& fresh) {
  const int V = model.config().vocab;
  const std::vector<int32_t> first = schedule_prompt(3, V), second = schedule_prompt(1, V);
  std::vector<float> row(static_cast<size_t>(V));
  model.forward(first.data(), int(first.size()), used, row.data());
  const int32_t first_next = argmax_of(row);
  model.forward(&first_next, 1, used, nullptr);  // a decode step: the GPU records its graph here
  used.reset();
  std::vector<std::vector<float>> out;
  for (SequenceState* st : {&used, &fresh}) {
    model.forward(second.data(), int(second.size()), *st, row.data());
    out.push_back(row);
    const int32_t t = argmax_of(out.back());
    model.forward(&t, 1, *st, row.data());
    out.push_back(row);
  }
  return out;
}

}  // namespace petrel::test
