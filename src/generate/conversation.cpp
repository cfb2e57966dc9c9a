#include "generate/conversation.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace petrel {

GenerateRequest make_request(const ConversationOptions& o, std::span<const int32_t> tokens) {
  GenerateRequest req;
  req.tokens = tokens;
  req.sampling = o.sampling;
  req.eos_ids = o.eos_ids;
  req.max_tokens = o.max_tokens;
  req.speculative = o.speculative;
  req.grammar = o.grammar;
  return req;
}
namespace {

using nlohmann::ordered_json;

bool strict_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return a.size() < b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

Conversation::Conversation(Decoder& decoder, const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                           ConversationOptions options)
    : decoder_(decoder), tokenizer_(tokenizer), template_(chat_template), options_(std::move(options)),
      generator_(decoder) {
  check(options_.capacity > 0, "conversation: the context must hold at least one token");
}

ordered_json Conversation::messages_with(const std::string& user) const {
  ordered_json messages = ordered_json::array();
  if (!options_.system.empty()) messages.push_back({{"role", "system"}, {"content", options_.system}});
  for (const auto& m : history_) messages.push_back(m);
  messages.push_back({{"role", "user"}, {"content", user}});
  return messages;
}

std::string Conversation::render(const ordered_json& messages, bool generation_prompt) const {
  ChatRequest req;
  req.messages = messages;
  req.add_generation_prompt = generation_prompt;
  if (!options_.thinking) req.kwargs["enable_thinking"] = false;
  return template_->apply(req);
}

std::vector<int32_t> Conversation::encode(const std::string& text) const {
  const std::vector<uint32_t> ids = tokenizer_.encode(text);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::vector<int32_t> Conversation::prompt_for(const std::string& user) const {
  return template_ ? encode(render(messages_with(user), true)) : encode(user);
}

void Conversation::reuse_prefix(const std::vector<int32_t>& prompt) {
  if (st_ && strict_prefix(st_tokens_, prompt)) return;
  if (st_ && checkpoint_ && strict_prefix(checkpoint_tokens_, prompt)) {
    st_->copy_from(*checkpoint_);
    st_tokens_ = checkpoint_tokens_;
    return;
  }
  st_ = decoder_.new_sequence(options_.capacity);
  st_tokens_.clear();
}

void Conversation::checkpoint(const ordered_json& messages, const std::vector<int32_t>& prompt) {
  const std::vector<int32_t> head = encode(render(messages, false));
  if (head.size() <= st_tokens_.size() || !strict_prefix(head, prompt)) return;
  const int n = int(st_tokens_.size());
  decoder_.feed(head.data() + n, int(head.size()) - n, *st_, KeepLogits::None);
  st_tokens_ = head;
  if (!checkpoint_) checkpoint_ = decoder_.new_sequence(options_.capacity);
  checkpoint_->copy_from(*st_);
  checkpoint_tokens_ = head;
}

Turn Conversation::ask(const std::string& user, const TextOutput::Show& show, const std::atomic<bool>* cancel) {
  const auto start = std::chrono::steady_clock::now();
  const ordered_json messages = messages_with(user);
  const std::vector<int32_t> prompt = template_ ? encode(render(messages, true)) : encode(user);
  check(!prompt.empty(), "the prompt is empty");
  check(int(prompt.size()) < options_.capacity,
        "the " + std::string(options_.multi_turn ? "conversation" : "prompt") + " is " + std::to_string(prompt.size()) +
            " tokens but the context holds at most " + std::to_string(options_.capacity) + " (with room to answer)");
  try {
    reuse_prefix(prompt);
    const int reused = int(st_tokens_.size());
    if (template_ && options_.multi_turn) checkpoint(messages, prompt);
    const ThinkFilter think = template_ ? ThinkFilter(tokenizer_, prompt) : ThinkFilter();
    TextOutput text(tokenizer_, think, options_.stops, show);
    GenerateRequest req = make_request(options_, prompt);
    req.cancel = cancel;
    req.start = start;
    req.reasoning = think.reasoning();
    Turn turn;
    turn.result = generator_.generate(st_, req, [&](int32_t id) { return text.push(id); });
    text.finish();
    turn.text = text.transcript();
    turn.result.stats.prefilled = int(prompt.size()) - reused;  // the checkpoint's prefill included
    const auto& out = turn.result.tokens;
    st_tokens_.assign(prompt.begin(), prompt.begin() + std::min<ptrdiff_t>(st_->n_past, ptrdiff_t(prompt.size())));
    if (!out.empty()) st_tokens_.insert(st_tokens_.end(), out.begin(), out.end() - 1);
    if (template_ && options_.multi_turn && !out.empty()) {
      history_.push_back({{"role", "user"}, {"content", user}});
      history_.push_back({{"role", "assistant"}, {"content", turn.text}});
    }
    return turn;
  } catch (...) {
    st_.reset();  // whatever it holds now is unknown
    st_tokens_.clear();
    throw;
  }
}

}  // namespace petrel
