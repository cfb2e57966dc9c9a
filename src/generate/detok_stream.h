// Streaming detokenizer: turns generated ids into text as soon as the text is complete UTF-8.
#pragma once
#include <cstdint>
#include <string>

#include "petrel/tokenizer.h"

namespace petrel {

// A token may end in the middle of a multi-byte character (byte-level BPE splits emoji and CJK
// across tokens). The stream holds such a tail back until later tokens complete it, so every
// piece it returns is valid UTF-8 and the pieces concatenate to Tokenizer::decode of all ids.
class DetokStream {
 public:
  explicit DetokStream(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

  // Adds one token; returns the text it completed (often empty or one character).
  std::string push(uint32_t id);

  // Ends the stream: bytes still waiting for completion become U+FFFD, as decode() does.
  std::string finish();

  // Bytes held back, waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace petrel
