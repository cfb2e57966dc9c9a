// --json-schema FILE: a JSON schema compiled into the token grammar that holds answers to it
// (`run`, and `bench --concurrency` to time structured output).
#pragma once
#include <memory>
#include <string>

#include "grammar/token_grammar.h"
#include "petrel/tokenizer.h"

namespace petrel::cli {

// The schema in `file` compiled for `vocab_rows` rows of `tokenizer`'s vocabulary (rows past the
// tokenizer's are never allowed), or null when `file` is empty. Errors name the file.
std::shared_ptr<const grammar::TokenGrammar> schema_grammar(const std::string& file, const Tokenizer& tokenizer,
                                                             int vocab_rows);

}  // namespace petrel::cli
