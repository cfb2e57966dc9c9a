#include "server/served_model.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "generate/generation_config.h"
#include "io/model_tokenizer.h"
#include "server/api_error.h"
#include "tokenizer/special_text_guard.h"

namespace petrel::server {
namespace {

// A checkpoint without a usable template (a base model) still serves /v1/completions; `why` says
// what went wrong for the 400 that chat requests get.
std::optional<ChatTemplate> load_template(const std::string& dir, std::string& why) {
  try {
    return load_chat_template(dir);
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

// Grammars kept with their token masks (~20 KB a grammar state on a 150k vocabulary).
constexpr size_t kKeptGrammars = 16;

void add_unique(std::vector<int32_t>& ids, int32_t id) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

std::string folder_name(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
  return (path.has_filename() ? path.filename() : path.parent_path().filename()).string();
}

// Where the tokenizer, chat template and generation defaults come from.
const std::string& text_dir(const ServeOptions& o) { return o.synthetic.empty() ? o.dir : o.tokenizer; }

}  // namespace

ServedModel::ServedModel(const ServeOptions& o)
    : loaded_(o.synthetic.empty()
                  ? load_model(o.dir, o.load)
                  : load_synthetic(o.synthetic, o.load, int(load_tokenizer(o.tokenizer).vocab_size()))),
      tokenizer_(load_tokenizer(text_dir(o))),
      chat_template_(load_template(text_dir(o), template_error_)),
      client_special_tokens_(o.special_tokens_in_content) {
  const ModelConfig& config = loaded_.config();
  const GenerationDefaults generation = load_generation_defaults(text_dir(o), [&](const std::string& text) {
    const auto id = tokenizer_.token_id(text);
    return id ? std::optional<int32_t>(int32_t(*id)) : std::nullopt;
  });
  defaults_.model_name = !o.model_name.empty() ? o.model_name : o.synthetic.empty() ? folder_name(o.dir) : o.synthetic;
  defaults_.sampling = generation.sampling;
  defaults_.vocab = config.vocab;
  defaults_.max_tokens = o.max_tokens;
  defaults_.max_json_depth = o.max_json_depth;
  if (chat_template_) defaults_.tool_call_form = tool_call_form(*chat_template_);
  grammars_ = std::make_unique<GrammarCache>(
      std::make_shared<grammar::TokenVocab>(grammar::make_token_vocab(tokenizer_, config.vocab)), kKeptGrammars);
  for (int id : config.eos_ids) add_unique(eos_ids_, id);
  for (int32_t id : generation.eos_ids) add_unique(eos_ids_, id);
  SchedulerOptions scheduler = o.scheduler;
  if (config.max_position > 0) scheduler.context = std::min(scheduler.context, config.max_position);
  context_ = scheduler.context;
  scheduler_ = std::make_unique<Scheduler>(*loaded_.model, scheduler);
}

std::string ServedModel::summary() const {
  return loaded_.summary() + ", max " + std::to_string(scheduler_->metrics().slots_total) + " sequences of " +
         std::to_string(context_) + " tokens" +
         (chat_template_ ? "" : ", no chat template (" + template_error_ + ")");
}

std::vector<int32_t> ServedModel::encode(const std::string& text) const {
  const std::vector<uint32_t> ids = tokenizer_.encode(text);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string ServedModel::render(const ChatRequest& request) const {
  try {
    return chat_template_->apply(request);
  } catch (const std::exception& e) {  // raise_exception, or a template meeting values it cannot handle
    throw invalid("messages", std::string("the chat template rejected the conversation: ") + e.what());
  }
}

std::vector<int32_t> ServedModel::chat_prompt(const json& messages, const json& tools, const json& kwargs,
                                              bool add_generation_prompt) const {
  if (!chat_template_)
    throw ApiError(400, "this checkpoint has no usable chat template (" + template_error_ + "): use /v1/completions",
                   "messages", "no_chat_template");
  ChatRequest request;
  request.add_generation_prompt = add_generation_prompt;
  if (client_special_tokens_ == ClientSpecialTokens::Special) {
    request.messages = messages;
    request.tools = tools;
    request.kwargs = kwargs;
    return encode(render(request));
  }
  SpecialTextGuard guard(tokenizer_.special_token_texts());
  request.messages = guard.shield(messages);
  request.tools = guard.shield(tools);
  request.kwargs = guard.shield(kwargs);
  const GuardedText prompt = guard.restore(render(request));
  const std::vector<uint32_t> ids = tokenizer_.encode(prompt.text, prompt.literal);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::shared_ptr<const grammar::TokenGrammar> ServedModel::token_grammar(const std::string& key, const grammar::Grammar& g) {
  return grammars_->get(key, g);
}

void ServedModel::check_fits(size_t prompt_tokens, const char* param) const {
  if (prompt_tokens < size_t(context_)) return;
  throw ApiError(400,
                 "the prompt is " + std::to_string(prompt_tokens) + " tokens but the context holds " +
                     std::to_string(context_) + " (prompt and answer together); shorten the prompt",
                 param, "context_length_exceeded");
}

}  // namespace petrel::server
