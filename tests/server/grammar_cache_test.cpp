// The server's grammar cache: a key seen again gives the same grammar (and its token masks); the
// least recently used one goes when it is full.
#include <gtest/gtest.h>

#include "grammar/json_schema.h"
#include "server/grammar_cache.h"

namespace petrel::server {
namespace {

TEST(GrammarCache, KeepsRecentGrammarsByKey) {
  auto vocab = std::make_shared<grammar::TokenVocab>(grammar::make_token_vocab(std::vector<std::string>{"", "{", "}"}));
  GrammarCache cache(vocab, 2);
  const grammar::Grammar g = grammar::json_object_grammar();
  const auto a = cache.get("a", g), b = cache.get("b", g);
  EXPECT_NE(a, b);
  EXPECT_EQ(cache.get("a", g), a);  // "a" is now the most recent
  cache.get("c", g);                // "b" goes
  EXPECT_EQ(cache.get("a", g), a);
  EXPECT_NE(cache.get("b", g), b);
}

}  // namespace
}  // namespace petrel::server
