#include "grammar/token_vocab.h"

#include <algorithm>

namespace petrel::grammar {
namespace {

TokenVocab sorted(std::vector<std::pair<std::string, int32_t>> tokens, int rows) {
  std::sort(tokens.begin(), tokens.end());
  TokenVocab v;
  v.rows = rows;
  v.position.assign(size_t(rows), -1);
  for (auto& [text, id] : tokens) {
    const std::string& prev = v.bytes.empty() ? text : v.bytes.back();
    const auto mismatch = std::mismatch(prev.begin(), prev.end(), text.begin(), text.end());
    v.shared.push_back(v.bytes.empty() ? 0 : uint32_t(mismatch.first - prev.begin()));
    v.longest = std::max(v.longest, text.size());
    v.position[size_t(id)] = int32_t(v.ids.size());
    v.ids.push_back(id);
    v.bytes.push_back(std::move(text));
  }
  return v;
}

}  // namespace

TokenVocab make_token_vocab(const Tokenizer& tokenizer, int rows) {
  std::vector<std::pair<std::string, int32_t>> tokens;
  const uint32_t n = std::min<uint32_t>(tokenizer.vocab_size(), uint32_t(rows));
  for (uint32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    std::string_view bytes;
    try {
      bytes = tokenizer.token_bytes(id);
    } catch (const std::exception&) {
      continue;  // an id with no token
    }
    if (!bytes.empty()) tokens.emplace_back(std::string(bytes), int32_t(id));
  }
  return sorted(std::move(tokens), rows);
}

TokenVocab make_token_vocab(const std::vector<std::string>& texts) {
  std::vector<std::pair<std::string, int32_t>> tokens;
  for (size_t i = 0; i < texts.size(); ++i)
    if (!texts[i].empty()) tokens.emplace_back(texts[i], int32_t(i));
  return sorted(std::move(tokens), int(texts.size()));
}

}  // namespace petrel::grammar
