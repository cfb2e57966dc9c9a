// A GGUF file's tokenizer rebuilt as the tokenizer.json it was converted from. The converter
// (conversion/base.py TextModel.get_vocab_base and _set_vocab_gpt2, gguf-py vocab.py
// SpecialVocab) writes, for a byte-level BPE ("gpt2") vocabulary:
//
// - tokenizer.ggml.tokens: one entry per id up to config.json's vocab_size. Vocab entries keep
//   their byte-level spelling ("Ġthe"); added tokens are stored as the text they match (decoded);
//   ids the tokenizer lacks are "[PADn]" fillers of type UNUSED.
// - tokenizer.ggml.token_type: NORMAL for vocab entries, CONTROL for added tokens marked special
//   (or that look special, "<|...|>"), USER_DEFINED for the other added tokens, UNUSED fillers.
// - tokenizer.ggml.merges: "left right", in rank order (no key when there are none).
// - tokenizer.ggml.pre: a name the converter picks by hashing the ids of a probe text; the name
//   stands for the model family's normalizer and pre-tokenizer regex, which the file lacks.
#include "io/gguf_tokenizer.h"

#include <map>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_parts.h"

namespace petrel {
namespace {

using nlohmann::json;

// gguf-py constants.py TokenType.
enum TokenType : int64_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

// The pre-tokenizer regex of each tokenizer.ggml.pre name Petrel knows: the Split pattern of the
// family's tokenizer.json (Qwen2/Qwen3; Qwen3.5 adds combining marks \p{M} to letter runs).
const std::map<std::string, std::string>& known_pre_tokenizers() {
  static const std::map<std::string, std::string> kPatterns = {
      {"qwen2",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {"qwen35",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
  };
  return kPatterns;
}

std::string known_pre_list() {
  std::string list;
  for (const auto& [name, pattern] : known_pre_tokenizers()) list += (list.empty() ? "" : ", ") + name;
  return list;
}

// The tokenizer.json pre_tokenizer of a Qwen family: the regex split, then byte-level symbols.
json pre_tokenizer_for(const GgufMetadata& md) {
  const std::string pre = md.get_string("tokenizer.ggml.pre");
  const auto it = known_pre_tokenizers().find(pre);
  check(it != known_pre_tokenizers().end(), md.file() + ": metadata key 'tokenizer.ggml.pre' is '" + pre +
                                                "', a pre-tokenizer Petrel does not know (it knows " +
                                                known_pre_list() + ")");
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", it->second}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
}

// "left right" as the converter joins a merge (byte-level symbols hold no space).
std::pair<std::string, std::string> merge_parts(const GgufMetadata& md, const std::string& merge, size_t rank) {
  const size_t space = merge.find(' ', 1);
  check(space != std::string::npos && space + 1 < merge.size() && merge.find(' ', space + 1) == std::string::npos,
        md.file() + ": metadata key 'tokenizer.ggml.merges' entry " + std::to_string(rank) + " is '" + merge +
            "', expected two symbols separated by one space");
  return {merge.substr(0, space), merge.substr(space + 1)};
}

// Vocab entries, added tokens and fillers, by the type the converter gave each id.
void read_tokens(const GgufMetadata& md, Tokenizer::Parts& parts) {
  const std::vector<std::string> tokens = md.get_strings("tokenizer.ggml.tokens");
  const std::vector<int64_t> types = md.get_ints("tokenizer.ggml.token_type");
  check(types.size() == tokens.size(), md.file() + ": metadata key 'tokenizer.ggml.token_type' has " +
                                           std::to_string(types.size()) + " entries, expected one per token (" +
                                           std::to_string(tokens.size()) + ")");
  for (size_t id = 0; id < tokens.size(); ++id) {
    switch (types[id]) {
      case kNormal: parts.tables.vocab.emplace_back(tokens[id], uint32_t(id)); break;
      case kUnused: break;  // an id the Hugging Face tokenizer does not have
      case kControl:
      case kUserDefined: {
        // Stored decoded, so matched in the raw text; the converter keeps no strip flags.
        tokenizer::AddedToken a;
        a.id = uint32_t(id);
        a.content = tokens[id];
        a.normalized = false;
        a.special = types[id] == kControl;
        check(!a.content.empty(), md.file() + ": token " + std::to_string(id) + " is an added token with empty text");
        parts.added.push_back(std::move(a));
        break;
      }
      default:
        throw Error(md.file() + ": metadata key 'tokenizer.ggml.token_type' gives token " + std::to_string(id) +
                    " ('" + tokens[id] + "') type " + std::to_string(types[id]) +
                    ", which a gpt2 vocabulary does not use (expected 1 normal, 3 control, 4 user-defined or 5 unused)");
    }
  }
}

}  // namespace

Tokenizer gguf_tokenizer(const GgufMetadata& md) {
  const std::string model = md.get_string("tokenizer.ggml.model");
  check(model == "gpt2", md.file() + ": metadata key 'tokenizer.ggml.model' is '" + model +
                             "', a tokenizer Petrel does not read (it reads gpt2, byte-level BPE)");
  Tokenizer::Parts parts;
  // Qwen's tokenizer.json normalizes to NFC before anything else; GGUF has no key for it.
  parts.normalizer = {{"type", "NFC"}};
  parts.pre_tokenizer = pre_tokenizer_for(md);
  parts.model = {{"type", "BPE"}};
  read_tokens(md, parts);
  // SpecialVocab writes no merges key for a vocabulary without merges (bytes only).
  const std::vector<std::string> merges =
      md.has("tokenizer.ggml.merges") ? md.get_strings("tokenizer.ggml.merges") : std::vector<std::string>{};
  parts.tables.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) parts.tables.merges.push_back(merge_parts(md, merges[rank], rank));
  return Tokenizer::from_parts(std::move(parts), md.file());
}

ChatTemplate gguf_chat_template(const GgufMetadata& md) {
  std::map<std::string, std::string> named;
  if (md.has("tokenizer.chat_template")) named["default"] = md.get_string("tokenizer.chat_template");
  // gguf-py's add_chat_template writes a list of named templates as tokenizer.chat_template.NAME
  // keys listed in tokenizer.chat_templates, the "default" one as tokenizer.chat_template.
  if (md.has("tokenizer.chat_templates"))
    for (const std::string& name : md.get_strings("tokenizer.chat_templates"))
      named[name] = md.get_string("tokenizer.chat_template." + name);
  check(!named.empty(), "no chat template in " + md.file() + " (expected metadata key 'tokenizer.chat_template')");

  // The strings transformers passes to templates as bos_token, eos_token, ...
  static const std::pair<const char*, const char*> kSpecial[] = {
      {"tokenizer.ggml.bos_token_id", "bos_token"},     {"tokenizer.ggml.eos_token_id", "eos_token"},
      {"tokenizer.ggml.unknown_token_id", "unk_token"}, {"tokenizer.ggml.padding_token_id", "pad_token"},
      {"tokenizer.ggml.seperator_token_id", "sep_token"}, {"tokenizer.ggml.mask_token_id", "mask_token"},
  };
  const std::vector<std::string> tokens = md.get_strings("tokenizer.ggml.tokens");
  const std::vector<int64_t> types = md.get_ints("tokenizer.ggml.token_type");
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  for (const auto& [key, name] : kSpecial) {
    if (!md.has(key)) continue;
    const uint64_t id = md.get_uint(key);
    check(id < tokens.size() && id < types.size(), md.file() + ": metadata key '" + key + "' is " + std::to_string(id) +
                                                       ", outside the " + std::to_string(tokens.size()) + " tokens");
    special[name] = types[id] == kNormal ? byte_level::decoder_bytes(tokens[id]) : tokens[id];
  }
  try {
    return ChatTemplate(named, special);
  } catch (const Error& e) {
    throw Error(md.file() + ": metadata key 'tokenizer.chat_template': " + e.what());
  }
}

}  // namespace petrel
