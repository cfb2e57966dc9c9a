// Request bodies through what the server does with them before generating: parse_body, the
// endpoint's validation, the chat template and the tokenizer, with models/petrel-tiny's tokenizer,
// generation defaults and template (no weights). Chat requests are also rendered by Qwen3.5's
// template, which renders tools, tool calls and reasoning. The first byte picks the endpoint:
// 't' is /v1/completions, anything else /v1/chat/completions; the rest is the body. A request
// may be refused (ApiError, petrel::Error) but never crash or throw anything else.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "generate/generation_config.h"
#include "io/hf_config.h"
#include "petrel/tokenizer.h"
#include "server/api_error.h"
#include "server/request.h"
#include "tokenizer/chat_template.h"

namespace {

using namespace petrel;
using namespace petrel::server;
using petrel::fuzz::require;

const std::filesystem::path kSourceDir = PETREL_SOURCE_DIR;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Model {
  Tokenizer tokenizer;
  std::vector<ChatTemplate> templates;
  RequestDefaults defaults;
};

Model load_model() {
  const std::filesystem::path dir = kSourceDir / "models" / "petrel-tiny";
  Model m{Tokenizer::load(dir), {}, {}};
  m.templates.push_back(ChatTemplate::load(dir));
  m.templates.emplace_back(
      std::map<std::string, std::string>{
          {"default", read_file(kSourceDir / "tests" / "fixtures" / "tokenizer" / "qwen3_5_chat_template.jinja")}},
      json::object());
  const auto token = [&m](const std::string& text) {
    const auto id = m.tokenizer.token_id(text);
    return id ? std::optional<int32_t>(int32_t(*id)) : std::nullopt;
  };
  m.defaults.model_name = "petrel-tiny";
  m.defaults.sampling = load_generation_defaults(dir, token).sampling;
  m.defaults.vocab = parse_hf_config(read_hf_config_json((dir / "config.json").string()), "config.json").vocab;
  return m;
}

const Model& model() {
  static const Model m = load_model();
  return m;
}

void check_ids(const Model& m, const std::vector<uint32_t>& ids) {
  for (uint32_t id : ids) require(id < m.tokenizer.vocab_size(), "token id " + std::to_string(id) + " past the vocabulary");
  m.tokenizer.decode(ids);
}

void chat(const Model& m, const std::string& body) {
  const ChatCompletionRequest r = parse_chat_request(parse_body(body), m.defaults);
  ChatRequest request;
  request.messages = r.messages;
  request.tools = r.tools;
  request.kwargs = r.template_kwargs;
  request.add_generation_prompt = true;
  for (const ChatTemplate& t : m.templates) {
    std::string text;
    try {
      text = t.apply(request);
    } catch (const Error&) {
      continue;  // the server's 400: the template rejected the conversation
    }
    check_ids(m, m.tokenizer.encode(text));
  }
}

void completion(const Model& m, const std::string& body) {
  const TextCompletionRequest r = parse_completion_request(parse_body(body), m.defaults);
  if (r.prompt_ids.empty()) check_ids(m, m.tokenizer.encode(r.prompt));
  for (int32_t id : r.prompt_ids) require(id >= 0 && id < m.defaults.vocab, "prompt id outside the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return -1;
  const Model& m = model();
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] == 't') completion(m, body);
    else chat(m, body);
  } catch (const ApiError&) {
  } catch (const Error&) {
  }
  return 0;
}
