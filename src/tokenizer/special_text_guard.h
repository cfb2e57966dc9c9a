// Special-token text that a client wrote (in messages, tools, template arguments) kept plain text
// through a chat-template render, as OpenAI's API treats it. The rendered prompt is one string,
// so the text's origin is carried through the render: first every such text in the request's
// strings becomes a sentinel no client can write (digits around a random nonce, new for each
// guard), which templates pass through unchanged; after the render the sentinels become the
// client's text again and their byte ranges are recorded for Tokenizer::encode(text, literal).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/tokenizer.h"

namespace petrel {

// A rendered prompt and where in it the client's special-token text lies.
struct GuardedText {
  std::string text;
  std::vector<ByteRange> literal;  // sorted, disjoint
};

class SpecialTextGuard {
 public:
  // `specials`: the texts of the tokenizer's special tokens (Tokenizer::special_token_texts).
  explicit SpecialTextGuard(std::vector<std::string> specials);

  // `value` with the special-token text of its strings and object keys replaced by sentinels:
  // every whole special token, the start of one that ends a string and the end of one that
  // begins it (whitespace around the string aside), which the template's own text could complete
  // ("<|im_start|" before a template's ">").
  nlohmann::ordered_json shield(nlohmann::ordered_json value);

  // The rendered text with each sentinel back as the text it stands for, and where those lie.
  // A sentinel the template mangled stays as it is: digits, never a special token.
  GuardedText restore(std::string_view rendered) const;

 private:
  std::string shield_string(const std::string& s);
  // Keys are shielded too: templates print some (tool-call argument names).
  void shield_keys(nlohmann::ordered_json& object);
  std::vector<ByteRange> special_ranges(std::string_view s) const;
  std::string sentinel(size_t piece) const;

  std::vector<std::string> specials_;
  std::string nonce_;
  std::vector<std::string> pieces_;  // what each sentinel stands for, by its index
};

}  // namespace petrel
