// What a Tokenizer is built from, whichever file described it: tokenizer.json's "normalizer",
// "pre_tokenizer" and "model" options, its vocab and merges as tables, and its added tokens.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "petrel/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"

namespace petrel {

struct Tokenizer::Parts {
  nlohmann::json normalizer;     // null: none
  nlohmann::json pre_tokenizer;  // must include a ByteLevel step
  nlohmann::json model;          // the BPE options, without vocab and merges
  tokenizer::BpeTables tables;
  std::vector<tokenizer::AddedToken> added;
};

}  // namespace petrel
