#include "server/responses.h"

#include <algorithm>
#include <ctime>
#include <random>

namespace petrel::server {
namespace {

// OpenAI clamps impossible tokens to -9999 rather than writing -infinity (JSON has none).
double finite_logprob(float logprob) { return std::max(double(logprob), -9999.0); }

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  const uint32_t ids[] = {uint32_t(id)};
  return tokenizer.decode(ids);  // a token that ends inside a character shows U+FFFD, as OpenAI does
}

json token_bytes(const Tokenizer& tokenizer, int32_t id) {
  json bytes = json::array();
  for (unsigned char c : tokenizer.token_bytes(uint32_t(id))) bytes.push_back(int(c));
  return bytes;
}

json chat_token(const Tokenizer& tokenizer, const TokenLogprob& t) {
  return {{"token", token_text(tokenizer, t.token)},
          {"logprob", finite_logprob(t.logprob)},
          {"bytes", token_bytes(tokenizer, t.token)}};
}

}  // namespace

const char* finish_reason_text(const JobFinish& f) {
  switch (f.reason) {
    case FinishReason::MaxTokens:
    case FinishReason::ContextFull: return "length";
    default: return f.tool_calls > 0 ? "tool_calls" : "stop";
  }
}

json usage_json(int prompt_tokens, int completion_tokens, int cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix + "-";
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

ResponseBuilder::ResponseBuilder(const Tokenizer& tokenizer, std::string model, std::string id_prefix,
                                 std::string chunk_object)
    : tokenizer_(tokenizer),
      model_(std::move(model)),
      id_(random_id(id_prefix)),
      chunk_object_(std::move(chunk_object)),
      created_(int64_t(std::time(nullptr))) {}

json ResponseBuilder::envelope(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseBuilder::usage_chunk(int prompt_tokens, int completion_tokens, int cached_tokens) const {
  json chunk = envelope(chunk_object_.c_str());
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
  return chunk;
}

json ResponseBuilder::chat_logprobs(const std::vector<TokenLogprobs>& tokens) const {
  json content = json::array();
  for (const TokenLogprobs& t : tokens) {
    json entry = chat_token(tokenizer_, t.chosen);
    entry["top_logprobs"] = json::array();
    for (const TokenLogprob& alt : t.top) entry["top_logprobs"].push_back(chat_token(tokenizer_, alt));
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

json ResponseBuilder::legacy_logprobs(const std::vector<TokenLogprobs>& tokens) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprobs& t : tokens) {
    const std::string text = token_text(tokenizer_, t.chosen.token);
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(finite_logprob(t.chosen.logprob));
    json top = json::object();
    for (const TokenLogprob& alt : t.top) top[token_text(tokenizer_, alt.token)] = finite_logprob(alt.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(text_offset_);
    text_offset_ += text.size();
  }
  return out;
}

json ResponseBuilder::tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (const ToolCall& call : calls) {
    json entry = {{"id", random_id("call")},
                  {"type", "function"},
                  {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
    if (with_index) entry["index"] = tool_calls_sent_;
    ++tool_calls_sent_;
    out.push_back(std::move(entry));
  }
  return out;
}

ChatResponse::ChatResponse(const Tokenizer& tokenizer, std::string model, bool logprobs)
    : ResponseBuilder(tokenizer, std::move(model), "chatcmpl", "chat.completion.chunk"), logprobs_(logprobs) {}

json ChatResponse::whole(const JobUpdate& all, int prompt_tokens) {
  const Delta& d = all.delta;
  json message = {{"role", "assistant"}};
  message["content"] = d.content.empty() && !d.tool_calls.empty() ? json() : json(d.content);
  if (!d.reasoning.empty()) message["reasoning_content"] = d.reasoning;
  if (!d.tool_calls.empty()) message["tool_calls"] = tool_calls_json(d.tool_calls, /*with_index=*/false);
  json response = envelope("chat.completion");
  response["choices"] = json::array({{{"index", 0},
                                      {"message", std::move(message)},
                                      {"logprobs", logprobs_ ? chat_logprobs(all.logprobs) : json()},
                                      {"finish_reason", finish_reason_text(*all.finish)}}});
  response["usage"] = usage_json(prompt_tokens, all.finish->completion_tokens, all.finish->cached_tokens);
  return response;
}

json ChatResponse::chunk(json delta, const json& logprobs, const json& finish_reason, bool with_usage) const {
  json c = envelope("chat.completion.chunk");
  c["choices"] = json::array(
      {{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", logprobs}, {"finish_reason", finish_reason}}});
  if (with_usage) c["usage"] = nullptr;
  return c;
}

std::vector<json> ChatResponse::chunks(const JobUpdate& update, bool with_usage) {
  std::vector<json> out;
  if (!role_sent_) {
    out.push_back(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, with_usage));
    role_sent_ = true;
  }
  const Delta& d = update.delta;
  if (!d.empty() || (logprobs_ && !update.logprobs.empty())) {
    json delta = json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(d.tool_calls, /*with_index=*/true);
    out.push_back(chunk(std::move(delta), logprobs_ ? chat_logprobs(update.logprobs) : json(), nullptr, with_usage));
  }
  if (update.finish) out.push_back(chunk(json::object(), nullptr, finish_reason_text(*update.finish), with_usage));
  return out;
}

TextResponse::TextResponse(const Tokenizer& tokenizer, std::string model, bool logprobs)
    : ResponseBuilder(tokenizer, std::move(model), "cmpl", "text_completion"), logprobs_(logprobs) {}

json TextResponse::choice(const std::string& text, const std::vector<TokenLogprobs>& logprobs,
                          const json& finish_reason) {
  return {{"index", 0},
          {"text", text},
          {"logprobs", logprobs_ ? legacy_logprobs(logprobs) : json()},
          {"finish_reason", finish_reason}};
}

json TextResponse::whole(const JobUpdate& all, int prompt_tokens) {
  json response = envelope("text_completion");
  response["choices"] = json::array({choice(all.delta.content, all.logprobs, finish_reason_text(*all.finish))});
  response["usage"] = usage_json(prompt_tokens, all.finish->completion_tokens, all.finish->cached_tokens);
  return response;
}

std::vector<json> TextResponse::chunks(const JobUpdate& update, bool with_usage) {
  const bool has_text = !update.delta.content.empty() || (logprobs_ && !update.logprobs.empty());
  if (!has_text && !update.finish) return {};
  json c = envelope("text_completion");
  const json finish = update.finish ? json(finish_reason_text(*update.finish)) : json();
  c["choices"] = json::array({choice(update.delta.content, update.logprobs, finish)});
  if (with_usage) c["usage"] = nullptr;
  return {c};
}

}  // namespace petrel::server
