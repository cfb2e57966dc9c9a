#include "generate/detok_stream.h"

#include "tokenizer/utf8.h"

namespace petrel {

std::string DetokStream::push(uint32_t id) {
  const std::string_view bytes = tokenizer_->token_bytes(id);
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_.append(bytes);
  std::string out;
  const size_t consumed = utf8::append_lossy(pending_, out, /*final=*/false);
  pending_.erase(0, consumed);
  return out;
}

std::string DetokStream::finish() {
  std::string out;
  utf8::append_lossy(pending_, out, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace petrel
