// One answer held to a grammar: which tokens may come next (a bitmask over the vocabulary rows,
// uint32 words, the form a device sampler can take as well) and the state after each token.
// Reasoning models think first: the grammar starts after the block's closing tag, whether the
// prompt opened the block (Qwen3.5) or the answer's first token does (Qwen3).
#pragma once
#include <bitset>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "grammar/stacks.h"
#include "grammar/token_grammar.h"

namespace petrel::grammar {

// A tokenizer's reasoning tags (generate/think_filter.h finds them).
struct ReasoningTags {
  int32_t open = -1, close = -1;
  bool open_in_prompt = false;  // the prompt ends inside a block: the answer starts thinking
};

class Matcher {
 public:
  // `end_ids`: the tokens that end the answer (EOS, end of turn), allowed once the grammar may
  // end. `reasoning`: the model's tags, when it has them.
  Matcher(std::shared_ptr<const TokenGrammar> grammar, std::vector<int32_t> end_ids,
          std::optional<ReasoningTags> reasoning = std::nullopt);

  // The tokens allowed next, a bit each (token t: bit t % 32 of word t / 32), or null while the
  // model thinks (anything goes). Valid until the next accept().
  const uint32_t* mask();
  // Moves past a sampled token. Throws petrel::Error when the grammar does not allow it.
  void accept(int32_t token);

 private:
  bool is_end(int32_t token) const;
  std::bitset<256> first_bytes(const Stack& s) const;

  std::shared_ptr<const TokenGrammar> grammar_;
  std::vector<int32_t> end_ids_;
  enum class Phase { MayThink, Thinking, Grammar };
  Phase phase_ = Phase::Grammar;
  ReasoningTags tags_;
  std::vector<Stack> stacks_;
  std::vector<uint32_t> mask_;
};

}  // namespace petrel::grammar
