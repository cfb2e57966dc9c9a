// The matcher's masks (cached per grammar state, plus the tokens checked against the whole stack)
// against brute force over a small vocabulary: every token run through every stack, at each step
// of random walks through several schemas.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar_test_util.h"

namespace petrel::grammar {
namespace {

// Token 0 is the end token (no text); the others are pieces of JSON, many spanning a rule's end.
const std::vector<std::string> kTokens = {
    "", "{", "}", "[", "]", "\"", ":", ",", " ", ", ", ": ", "{\"", "\":", "\": ", "\",", "\"}", "\"]", "}}", "]}",
    "},", "],", "a", "b", "ab", "ba", "name", "age", "tags", "\"name", "\"age\": ", "\"tags\":", "x", "y", "z",
    "0", "1", "2", "5", "9", "12", "-", "-1", ".", ".5", "0.", "e", "null", "true", "false", "nu", "ll", "tr", "ue",
    "\\", "\\n", "\\\"", "\\u00", "e9", "\xc3", "\xa9", "\xc3\xa9", "ab\"", "a\",", "1,", "1]", "1}", "2, ", "red",
    "\"red\"", "green", "@", "-0", "}]", "x\"}", "\"x", "\"\"",
};

constexpr int32_t kEnd = 0;

// kTokens, then every printable ASCII character as a token of its own (as byte-level vocabularies
// have), so that any text can be written.
const std::vector<std::string>& tokens() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> t = kTokens;
    for (char c = 0x20; c < 0x7F; ++c)
      if (std::find(t.begin(), t.end(), std::string(1, c)) == t.end()) t.push_back(std::string(1, c));
    return t;
  }();
  return all;
}

std::vector<bool> brute_force(const TokenVocab& v, const Stepper& stepper, const std::vector<Stack>& stacks) {
  std::vector<bool> allowed(size_t(v.rows), false);
  for (int32_t id = 0; id < v.rows; ++id)
    if (v.position[size_t(id)] >= 0) allowed[size_t(id)] = !stepper.advance(stacks, v.text(id)).empty();
  allowed[kEnd] = stepper.can_end(stacks);
  return allowed;
}

// Random walks: at each step the mask equals brute force; the walk picks an allowed token.
void check_walks(const Json& schema, int walks, int steps) {
  auto vocab = std::make_shared<TokenVocab>(make_token_vocab(tokens()));
  auto g = std::make_shared<TokenGrammar>(json_schema_grammar(schema), vocab);
  std::mt19937 rng(7);
  for (int w = 0; w < walks; ++w) {
    Matcher m(g, {kEnd});
    std::vector<Stack> stacks = {{Frame{g->grammar().root, 0}}};
    std::string text;
    for (int step = 0; step < steps; ++step) {
      const uint32_t* mask = m.mask();
      const std::vector<bool> want = brute_force(*vocab, g->stepper(), stacks);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->rows; ++id) {
        const bool got = (mask[id / 32] >> (id % 32)) & 1u;
        ASSERT_EQ(got, bool(want[size_t(id)])) << schema.dump() << " after '" << text << "': token '" << tokens()[size_t(id)] << "'";
        if (got) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << "dead end after " << text;
      const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      m.accept(pick);
      if (pick == kEnd) break;
      text += tokens()[size_t(pick)];
      stacks = g->stepper().advance(stacks, tokens()[size_t(pick)]);
    }
  }
}

TEST(GrammarMatcher, MasksEqualBruteForceAlongRandomWalks) {
  check_walks(Json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
      "age": {"type": "integer", "minimum": -5, "maximum": 120}, "tags": {"type": "array", "items": {"enum": ["red", "green", 12]}}},
      "required": ["name", "age"]})"), 60, 40);
  check_walks(Json::parse(R"({"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "null"}, {"type": "string"}]}})"), 60, 30);
  check_walks(Json::parse(R"({"type": "object", "additionalProperties": {"type": "boolean"}, "properties": {"ab": {"const": 1}}})"), 60, 30);
  check_walks(Json::parse(R"({"$ref": "#/$defs/t", "$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}}})"), 40, 30);
}

TEST(GrammarMatcher, OnlyTheEndTokenFollowsACompleteValue) {
  auto vocab = std::make_shared<TokenVocab>(make_token_vocab(tokens()));
  auto g = std::make_shared<TokenGrammar>(json_schema_grammar(Json::parse(R"({"type": "object"})")), vocab);
  Matcher m(g, {kEnd});
  for (const char* t : {"{", "}"}) m.accept(int32_t(std::find(tokens().begin(), tokens().end(), t) - tokens().begin()));
  const uint32_t* mask = m.mask();
  for (int32_t id = 0; id < vocab->rows; ++id) EXPECT_EQ((mask[id / 32] >> (id % 32)) & 1u, id == kEnd ? 1u : 0u) << id;
  EXPECT_THROW(m.accept(1), Error);
}

bool allows(const uint32_t* mask, int32_t id) { return (mask[id / 32] >> (id % 32)) & 1u; }

int32_t id_of(const std::string& text) { return int32_t(std::find(tokens().begin(), tokens().end(), text) - tokens().begin()); }

TEST(GrammarMatcher, StartsAfterTheReasoning) {
  auto vocab = std::make_shared<TokenVocab>(make_token_vocab(tokens()));
  auto g = std::make_shared<TokenGrammar>(json_schema_grammar(Json::parse(R"({"type": "boolean"})")), vocab);
  const ReasoningTags tags{id_of("a"), id_of("b"), /*open_in_prompt=*/true};  // "a" and "b" stand for the tags
  Matcher opened(g, {kEnd}, tags);  // the prompt opened the block: anything goes until its end
  EXPECT_EQ(opened.mask(), nullptr);
  opened.accept(id_of("x"));
  EXPECT_EQ(opened.mask(), nullptr);
  opened.accept(tags.close);
  ASSERT_NE(opened.mask(), nullptr);
  EXPECT_TRUE(allows(opened.mask(), id_of("tr")));
  EXPECT_FALSE(allows(opened.mask(), kEnd));
  EXPECT_FALSE(allows(opened.mask(), tags.open));

  Matcher may_think(g, {kEnd}, ReasoningTags{tags.open, tags.close, false});  // the answer may open one
  EXPECT_TRUE(allows(may_think.mask(), tags.open));
  EXPECT_TRUE(allows(may_think.mask(), id_of("tr")));
  EXPECT_FALSE(allows(may_think.mask(), id_of("x")));
  may_think.accept(tags.open);
  EXPECT_EQ(may_think.mask(), nullptr);
  may_think.accept(tags.close);
  may_think.accept(id_of("false"));
  EXPECT_TRUE(allows(may_think.mask(), kEnd));

  Matcher direct(g, {kEnd}, ReasoningTags{tags.open, tags.close, false});  // or answer at once
  direct.accept(id_of("true"));
  EXPECT_TRUE(allows(direct.mask(), kEnd));
  EXPECT_FALSE(allows(direct.mask(), tags.open));
}

}  // namespace
}  // namespace petrel::grammar
