// The tokenizer and chat template of what a command was given as its model: a Hugging Face
// folder (tokenizer.json, chat_template.jinja / tokenizer_config.json) or a GGUF file, which
// carries both in its metadata.
#pragma once
#include <string>

#include "petrel/tokenizer.h"
#include "tokenizer/chat_template.h"

namespace petrel {

Tokenizer load_tokenizer(const std::string& model);
ChatTemplate load_chat_template(const std::string& model);
// Whether `model` has a tokenizer: a folder with tokenizer.json, or a GGUF file with a vocabulary.
bool has_tokenizer(const std::string& model);

}  // namespace petrel
