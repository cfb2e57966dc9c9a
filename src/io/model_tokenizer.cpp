#include "io/model_tokenizer.h"

#include <filesystem>

#include "io/gguf.h"
#include "io/gguf_tokenizer.h"

namespace petrel {

Tokenizer load_tokenizer(const std::string& model) {
  if (is_gguf_file(model)) return gguf_tokenizer(GgufModel(model).metadata());
  return Tokenizer::load(model);
}

ChatTemplate load_chat_template(const std::string& model) {
  if (is_gguf_file(model)) return gguf_chat_template(GgufModel(model).metadata());
  return ChatTemplate::load(model);
}

bool has_tokenizer(const std::string& model) {
  if (is_gguf_file(model)) return GgufModel(model).metadata().has("tokenizer.ggml.tokens");
  return std::filesystem::exists(std::filesystem::path(model) / "tokenizer.json");
}

}  // namespace petrel
