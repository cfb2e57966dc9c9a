// Petrel's tokenizer: Hugging Face tokenizer.json byte-level BPE (Qwen2/Qwen3/Qwen3.5, GPT-2 and
// Llama-3 style files), producing exactly the ids Hugging Face `tokenizers` produces.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace petrel {

// Bytes [begin, end) of a text.
struct ByteRange {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json. Unsupported features are an error naming them.
  static Tokenizer load(const std::filesystem::path& dir);
  // Builds from the text of a tokenizer.json; `source` names it in error messages.
  static Tokenizer from_json_text(std::string_view json_text, const std::string& source);
  // Builds from the parts another file format describes (GGUF metadata, io/gguf_tokenizer.cpp).
  struct Parts;  // defined in src/tokenizer/tokenizer_parts.h
  static Tokenizer from_parts(Parts&& parts, const std::string& source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text` (valid UTF-8), as Hugging Face's encode(text, add_special_tokens=False):
  // added tokens written in the text are recognised; no BOS/EOS is added (chat templates do that).
  std::vector<uint32_t> encode(std::string_view text) const;
  // The same, except that a special token overlapping one of the `literal` ranges (sorted,
  // disjoint) is not recognised: its text is encoded as ordinary text with what surrounds it, as
  // Hugging Face does with split_special_tokens=True. Added tokens not marked special are
  // recognised everywhere.
  std::vector<uint32_t> encode(std::string_view text, std::span<const ByteRange> literal) const;

  // The text of `ids`; bytes that do not form valid UTF-8 become U+FFFD, as in Hugging Face.
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens = false) const;

  // Raw bytes token `id` contributes to decoded text (possibly a partial UTF-8 sequence).
  std::string_view token_bytes(uint32_t id) const;
  bool is_special(uint32_t id) const;
  // The text of every added token marked special ("<|im_start|>", ...), in id order.
  std::vector<std::string> special_token_texts() const;
  // One past the largest id; ids below it without a token are rejected by decode.
  uint32_t vocab_size() const;
  // Id of an added token by its content, or of a vocab entry by its vocab (byte-level) spelling.
  std::optional<uint32_t> token_id(std::string_view token) const;

  // Drops the word cache, so that a benchmark can measure a cold start.
  void clear_cache() const;

  struct Impl;  // defined in src/tokenizer/tokenizer_impl.h

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace petrel
