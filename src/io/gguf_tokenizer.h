// The tokenizer and chat template a GGUF file carries in its metadata (tokenizer.ggml.*,
// tokenizer.chat_template), as llama.cpp's converter wrote them from the Hugging Face files.
#pragma once
#include "io/gguf.h"
#include "petrel/tokenizer.h"
#include "tokenizer/chat_template.h"

namespace petrel {

// The byte-level BPE tokenizer of a "gpt2" vocabulary with a pre-tokenizer Petrel knows by its
// tokenizer.ggml.pre name; throws petrel::Error naming the file and key otherwise.
Tokenizer gguf_tokenizer(const GgufMetadata& md);

// tokenizer.chat_template (and the named tokenizer.chat_template.NAME), with the special-token
// strings of tokenizer.ggml.*_token_id; throws petrel::Error when the file has no template.
ChatTemplate gguf_chat_template(const GgufMetadata& md);

}  // namespace petrel
