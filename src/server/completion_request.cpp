// /v1/completions: the shared fields plus the prompt (text or token ids, one prompt only).
#include "server/api_error.h"
#include "server/request.h"

namespace petrel::server {
namespace {

std::vector<int32_t> token_ids(const json& ids, int vocab, const std::string& path) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& id = ids[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
      throw invalid(path, path + "[" + std::to_string(i) + "]: expected a token id in [0, " + std::to_string(vocab - 1) +
                              "], found " + id.dump());
    out.push_back(id.get<int32_t>());
  }
  return out;
}

// A string, an array of token ids, or a one-element array holding either.
void parse_prompt(const Fields& f, int vocab, TextCompletionRequest& r) {
  const json* prompt = f.get("prompt");
  if (!prompt) throw invalid("prompt", "prompt: required");
  const json* single = prompt;
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    if (prompt->size() != 1) throw invalid("prompt", "prompt: only one prompt per request is supported");
    single = &(*prompt)[0];
  }
  if (single->is_string()) r.prompt = single->get<std::string>();
  else if (single->is_array()) r.prompt_ids = token_ids(*single, vocab, "prompt");
  else throw invalid("prompt", "prompt: expected a string or an array of token ids, found " + type_name(*single));
  if (r.prompt.empty() && r.prompt_ids.empty()) throw invalid("prompt", "prompt: must not be empty");
}

void check_unsupported(const Fields& f) {
  if (f.boolean("echo").value_or(false)) throw invalid("echo", "echo: not supported");
  if (f.integer("best_of", 1, 1 << 20).value_or(1) != 1) throw invalid("best_of", "best_of: only 1 is supported");
  if (const auto suffix = f.string("suffix"); suffix && !suffix->empty())
    throw invalid("suffix", "suffix: not supported");
}

}  // namespace

TextCompletionRequest parse_completion_request(const json& body, const RequestDefaults& defaults) {
  TextCompletionRequest r;
  r.gen = parse_generation_fields(body, defaults, /*chat=*/false);
  const Fields f(body, "");
  check_unsupported(f);
  parse_prompt(f, defaults.vocab, r);
  return r;
}

}  // namespace petrel::server
