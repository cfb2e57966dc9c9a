// A conversation with a model: messages rendered through the checkpoint's chat template (or raw
// text), the answer generated and streamed, the history kept for the next turn. Between turns
// the sequence state is reused for the longest prefix the new prompt shares with it.
#pragma once
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "generate/generator.h"
#include "generate/text_output.h"
#include "petrel/tokenizer.h"
#include "tokenizer/chat_template.h"

namespace petrel {

struct ConversationOptions {
  std::string system;       // system message; empty: none
  bool thinking = true;     // false passes enable_thinking=false to the template (Qwen3 /no_think)
  bool multi_turn = false;  // keep the history and a reusable checkpoint between turns
  int capacity = 0;         // tokens the sequence holds: prompt, history and answer together
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  int max_tokens = -1;
  std::vector<std::string> stops;
  SpeculativeOptions speculative;
  // Structured output: each answer is held to this grammar (null: free text).
  std::shared_ptr<const grammar::TokenGrammar> grammar;
};

// The generation request those options describe for `tokens` (cancel and start left to the caller).
GenerateRequest make_request(const ConversationOptions& o, std::span<const int32_t> tokens);

struct Turn {
  GenerateResult result;
  std::string text;  // the answer as the history keeps it (see TextOutput::transcript)
};

class Conversation {
 public:
  // `chat_template` null: raw completion, the user text is the whole prompt and there is no history.
  Conversation(Decoder& decoder, const Tokenizer& tokenizer, const ChatTemplate* chat_template,
               ConversationOptions options);

  // The token ids the conversation would be with `user` said next, generation prompt included.
  std::vector<int32_t> prompt_for(const std::string& user) const;

  // Says `user`, streams the answer to `show` and, with multi_turn, adds both to the history
  // (an interrupted answer is kept as far as it got). Errors (e.g. the conversation outgrew the
  // context) leave the history as it was.
  Turn ask(const std::string& user, const TextOutput::Show& show, const std::atomic<bool>* cancel = nullptr);

  void reset() { history_ = nlohmann::ordered_json::array(); }
  void set_system(std::string system) { options_.system = std::move(system); }
  void set_thinking(bool on) { options_.thinking = on; }
  const ConversationOptions& options() const { return options_; }
  size_t history_size() const { return history_.size(); }

 private:
  nlohmann::ordered_json messages_with(const std::string& user) const;
  std::string render(const nlohmann::ordered_json& messages, bool generation_prompt) const;
  std::vector<int32_t> encode(const std::string& text) const;
  // Leaves st_ holding a strict prefix of `prompt`: the live state, the checkpoint, or nothing.
  void reuse_prefix(const std::vector<int32_t>& prompt);
  // Prefills up to the end of the last user message and checkpoints there: the next turn's
  // prompt shares that prefix even where the template re-renders the answer (Qwen3 drops the
  // reasoning of earlier answers), and a recurrent state cannot be rewound to it afterwards.
  void checkpoint(const nlohmann::ordered_json& messages, const std::vector<int32_t>& prompt);

  Decoder& decoder_;
  const Tokenizer& tokenizer_;
  const ChatTemplate* template_;
  ConversationOptions options_;
  Generator generator_;
  nlohmann::ordered_json history_ = nlohmann::ordered_json::array();  // user and assistant messages
  std::unique_ptr<SequenceState> st_, checkpoint_;
  std::vector<int32_t> st_tokens_, checkpoint_tokens_;  // what each state holds
};

}  // namespace petrel
