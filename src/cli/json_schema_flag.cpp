#include "cli/json_schema_flag.h"

#include <fstream>
#include <iterator>

#include "core/error.h"
#include "grammar/json_schema.h"

namespace petrel::cli {

std::shared_ptr<const grammar::TokenGrammar> schema_grammar(const std::string& file, const Tokenizer& tokenizer,
                                                             int vocab_rows) {
  if (file.empty()) return nullptr;
  std::ifstream in(file, std::ios::binary);
  check(bool(in), "--json-schema: cannot open " + file);
  grammar::Json schema;
  try {
    schema = grammar::Json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  } catch (const std::exception& e) {
    throw Error("--json-schema " + file + ": not JSON: " + e.what());
  }
  try {
    auto vocab = std::make_shared<grammar::TokenVocab>(grammar::make_token_vocab(tokenizer, vocab_rows));
    return std::make_shared<grammar::TokenGrammar>(grammar::json_schema_grammar(schema), std::move(vocab));
  } catch (const Error& e) {
    throw Error("--json-schema " + file + ": " + e.what());
  }
}

}  // namespace petrel::cli
