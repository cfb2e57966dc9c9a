// The checkpoint a server answers with: model, tokenizer, chat template, generation defaults,
// and the scheduler that runs every request on the model. Also how a request becomes prompt ids.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/token_grammar.h"
#include "petrel/tokenizer.h"
#include "runtime/loaded_model.h"
#include "runtime/scheduler.h"
#include "server/grammar_cache.h"
#include "server/request.h"
#include "tokenizer/chat_template.h"

namespace petrel::server {

// How special-token text inside what a chat client sends (message contents, names, tool calls,
// tool results, tools, template arguments) is encoded.
enum class ClientSpecialTokens {
  Text,     // as plain text, as OpenAI's API does: a client cannot forge the template's turns
  Special,  // as the special tokens, as apply_chat_template followed by encode does
};

struct ServeOptions {
  std::string dir;
  std::string synthetic, tokenizer;  // instead of dir: random weights of a shape, a tokenizer folder
  std::string model_name;  // "" : the folder's name
  LoadOptions load;
  // 64 sequences, fewer where their states do not fit 90% of the GPU's free memory; a prefix cache
  // of 4 GiB.
  SchedulerOptions scheduler{.max_sequences = 64, .memory_fraction = 0.9, .prefix_cache = {.budget_bytes = size_t(4096) << 20}};
  int max_tokens = -1;     // default for requests without max_tokens; -1: until EOS or a full context
  ClientSpecialTokens special_tokens_in_content = ClientSpecialTokens::Text;
  int max_json_depth = kMaxJsonDepth;  // nesting of a request body (400 beyond)
};

class ServedModel {
 public:
  // Loads the checkpoint (weights, tokenizer.json, chat template when there is one) and starts
  // the scheduler. The context is lowered to the model's trained length when that is shorter.
  explicit ServedModel(const ServeOptions& options);

  const std::string& name() const { return defaults_.model_name; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const RequestDefaults& defaults() const { return defaults_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  int context() const { return context_; }
  Scheduler& scheduler() { return *scheduler_; }
  SchedulerMetrics scheduler_metrics() const { return scheduler_->metrics(); }
  std::string summary() const;

  // Messages (and tools) through the chat template, then the tokenizer. A template that rejects
  // the conversation (raise_exception) is a 400 naming "messages". Special-token text from the
  // client is encoded as the options say (ClientSpecialTokens); the template's own are tokens.
  std::vector<int32_t> chat_prompt(const json& messages, const json& tools, const json& kwargs,
                                   bool add_generation_prompt) const;
  // Raw text, special-token text included as the tokens (/v1/completions prompts).
  std::vector<int32_t> encode(const std::string& text) const;
  // A 400 (code context_length_exceeded, naming `param`) when the prompt leaves no room to answer.
  void check_fits(size_t prompt_tokens, const char* param) const;
  // A request's grammar joined to this model's vocabulary, for the scheduler: the one an earlier
  // request with the same key used, with the token masks it computed, when it is still kept.
  std::shared_ptr<const grammar::TokenGrammar> token_grammar(const std::string& key, const grammar::Grammar& g);

 private:
  std::string render(const ChatRequest& request) const;

  LoadedModel loaded_;
  Tokenizer tokenizer_;
  std::string template_error_;  // why there is no chat template; declared before chat_template_, which sets it
  std::optional<ChatTemplate> chat_template_;
  ClientSpecialTokens client_special_tokens_;
  RequestDefaults defaults_;
  std::vector<int32_t> eos_ids_;
  std::unique_ptr<GrammarCache> grammars_;
  int context_;
  std::unique_ptr<Scheduler> scheduler_;  // last: stopped before the model it runs is destroyed
};

}  // namespace petrel::server
