// Writes a Hugging Face tokenizer folder's vocabulary into GGUF metadata the way llama.cpp's
// converter does (conversion/base.py get_vocab_base, gguf-py vocab.py SpecialVocab).
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "tokenizer_test_util.h"

namespace petrel::test {

// The converter's does_token_look_special for the spellings Qwen vocabularies use.
inline bool looks_special(const std::string& t) {
  return t.size() >= 4 && t.rfind("<|", 0) == 0 && t.compare(t.size() - 2, 2, "|>") == 0;
}

// tokenizer.ggml.* and tokenizer.chat_template of `dir` (tokenizer.json, tokenizer_config.json),
// padded with [PADn] fillers to `vocab_size` ids, with pre-tokenizer name `pre`.
inline void write_gguf_vocab(GgufWriter& w, const std::filesystem::path& dir, size_t vocab_size,
                             const std::string& pre) {
  const nlohmann::json tok = nlohmann::json::parse(read_file(dir / "tokenizer.json"));
  const nlohmann::json cfg = nlohmann::json::parse(read_file(dir / "tokenizer_config.json"));
  std::vector<std::string> tokens(vocab_size);
  std::vector<int32_t> types(vocab_size, 5);  // UNUSED
  for (size_t i = 0; i < vocab_size; ++i) tokens[i] = "[PAD" + std::to_string(i) + "]";
  for (const auto& [text, id] : tok["model"]["vocab"].items()) {
    tokens[id.get<size_t>()] = text;
    types[id.get<size_t>()] = 1;  // NORMAL
  }
  for (const auto& a : tok["added_tokens"]) {
    const std::string content = a["content"];
    tokens[a["id"].get<size_t>()] = content;
    types[a["id"].get<size_t>()] = a["special"].get<bool>() || looks_special(content) ? 3 : 4;  // CONTROL, USER_DEFINED
  }
  std::vector<std::string> merges;
  for (const auto& m : tok["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());

  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_string("tokenizer.ggml.pre", pre);
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_array("tokenizer.ggml.token_type", GgufType::I32, types);
  w.kv_strings("tokenizer.ggml.merges", merges);
  // SpecialVocab takes bos/eos/pad from tokenizer_config.json's token strings, looked up among
  // the added tokens.
  for (const auto& [field, key] : {std::pair{"eos_token", "eos_token_id"}, {"pad_token", "padding_token_id"},
                                   {"bos_token", "bos_token_id"}}) {
    if (!cfg.contains(field) || !cfg[field].is_string()) continue;
    for (const auto& a : tok["added_tokens"])
      if (a["content"] == cfg[field]) w.kv(std::string("tokenizer.ggml.") + key, GgufType::U32, a["id"].get<uint32_t>());
  }
  if (cfg.contains("add_bos_token")) w.kv("tokenizer.ggml.add_bos_token", GgufType::Bool, uint8_t(cfg["add_bos_token"].get<bool>()));
  if (cfg.contains("chat_template")) w.kv_string("tokenizer.chat_template", cfg["chat_template"].get<std::string>());
}

}  // namespace petrel::test
