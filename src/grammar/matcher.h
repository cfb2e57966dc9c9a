// One answer held to a grammar: which tokens may come next (a bitmask over the vocabulary rows,
// uint32 words, the form a device sampler can take as well) and the state after each token.
// With a reasoning block open in the prompt, the grammar starts after the tag that closes it.
#pragma once
#include <bitset>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "grammar/stacks.h"
#include "grammar/token_grammar.h"

namespace petrel::grammar {

class Matcher {
 public:
  // `end_ids`: the tokens that end the answer (EOS, end of turn), allowed once the grammar may
  // end. `starts_after`: a token the grammar waits for (the reasoning block's closing tag).
  Matcher(std::shared_ptr<const TokenGrammar> grammar, std::vector<int32_t> end_ids,
          std::optional<int32_t> starts_after = std::nullopt);

  // The tokens allowed next, a bit each (token t: bit t % 32 of word t / 32), or null while the
  // grammar has not started. Valid until the next accept().
  const uint32_t* mask();
  // Moves past a sampled token. Throws petrel::Error when the grammar does not allow it.
  void accept(int32_t token);

 private:
  bool is_end(int32_t token) const;
  std::bitset<256> first_bytes(const Stack& s) const;

  std::shared_ptr<const TokenGrammar> grammar_;
  std::vector<int32_t> end_ids_;
  std::optional<int32_t> starts_after_;
  std::vector<Stack> stacks_;
  std::vector<uint32_t> mask_;
};

}  // namespace petrel::grammar
