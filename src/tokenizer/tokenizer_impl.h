// The parts of a loaded tokenizer, shared by loading (tokenizer_load.cpp) and use (tokenizer.cpp).
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "petrel/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenize.h"

namespace petrel {

struct Tokenizer::Impl {
  tokenizer::Normalizer normalizer;
  tokenizer::PreTokenizer pre_tokenizer;
  tokenizer::BpeModel model;
  tokenizer::AddedTokenMatcher raw_added;         // added tokens with normalized=false
  tokenizer::AddedTokenMatcher normalized_added;  // added tokens with normalized=true

  struct TokenInfo {
    std::string bytes;  // what decoding this id yields
    bool assigned = false;
    bool special = false;
  };
  std::vector<TokenInfo> tokens;  // indexed by id
  std::unordered_map<std::string, uint32_t> added_by_content;
};

}  // namespace petrel
