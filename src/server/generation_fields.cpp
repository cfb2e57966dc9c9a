// The fields /v1/chat/completions and /v1/completions share: model, n, streaming, length,
// stop strings, sampling and logprobs.
#include <random>

#include "grammar/json_schema.h"
#include "server/api_error.h"
#include "server/request.h"
#include "server/schema_param.h"

namespace petrel::server {
namespace {

constexpr int kMaxStops = 16;
constexpr int kMaxTopLogprobs = 20;  // what the scheduler reports at most
constexpr int64_t kMaxTokensLimit = int64_t(1) << 30;

std::vector<std::string> parse_stops(const Fields& f) {
  const json* v = f.get("stop");
  if (!v) return {};
  if (v->is_string()) {
    if (v->get<std::string>().empty()) throw invalid("stop", "stop: an empty stop string would stop at once");
    return {v->get<std::string>()};
  }
  if (!v->is_array()) throw invalid("stop", "stop: expected a string or an array of strings, found " + type_name(*v));
  if (v->size() > kMaxStops)
    throw invalid("stop", "stop: at most " + std::to_string(kMaxStops) + " stop strings, found " + std::to_string(v->size()));
  std::vector<std::string> stops;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& s = (*v)[i];
    const std::string name = "stop[" + std::to_string(i) + "]";
    if (!s.is_string()) throw invalid(name, name + ": expected a string, found " + type_name(s));
    if (s.get<std::string>().empty()) throw invalid(name, name + ": an empty stop string would stop at once");
    stops.push_back(s.get<std::string>());
  }
  return stops;
}

int32_t parse_token_key(const std::string& key, int vocab) {
  size_t used = 0;
  long long id = -1;
  try {
    id = std::stoll(key, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != key.size() || key.empty())
    throw invalid("logit_bias", "logit_bias: keys must be token ids, found '" + key + "'");
  if (id < 0 || id >= vocab)
    throw invalid("logit_bias", "logit_bias: token id " + key + " is outside the vocabulary (0.." +
                                    std::to_string(vocab - 1) + ")");
  return int32_t(id);
}

void parse_logit_bias(const Fields& f, int vocab, SamplingParams& s) {
  const json* v = f.get("logit_bias");
  if (!v) return;
  if (!v->is_object()) throw invalid("logit_bias", "logit_bias: expected an object of token id -> bias, found " + type_name(*v));
  for (const auto& [key, bias] : v->items()) {
    const int32_t id = parse_token_key(key, vocab);
    if (!bias.is_number() || !(bias.get<double>() >= -100 && bias.get<double>() <= 100))
      throw invalid("logit_bias", "logit_bias: the bias of token " + key + " must be a number in [-100, 100], found " +
                                      bias.dump());
    s.logit_bias[id] = bias.get<float>();
  }
}

uint64_t parse_seed(const Fields& f) {
  const json* v = f.get("seed");
  if (!v) {
    std::random_device rd;
    return uint64_t(rd()) << 32 | rd();
  }
  if (!v->is_number_integer()) throw invalid("seed", "seed: expected an integer, found " + type_name(*v));
  return v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
}

// Overrides the server defaults with the request's sampling fields.
SamplingParams parse_sampling(const Fields& f, const RequestDefaults& d) {
  SamplingParams s = d.sampling;
  if (auto t = f.number("temperature", 0, 100, "a number in [0, 100]")) s.temperature = float(*t);
  if (auto p = f.number("top_p", 0, 1, "a number in (0, 1]")) {
    if (*p <= 0) throw invalid("top_p", "top_p: expected a number in (0, 1], found 0");
    s.top_p = float(*p);
  }
  if (auto k = f.integer("top_k", -1, 1 << 30)) s.top_k = int(std::max<int64_t>(*k, 0));  // -1 and 0: off
  if (auto m = f.number("min_p", 0, 1, "a number in [0, 1]")) s.min_p = float(*m);
  if (auto p = f.number("presence_penalty", -2, 2, "a number in [-2, 2]")) s.presence_penalty = float(*p);
  if (auto p = f.number("frequency_penalty", -2, 2, "a number in [-2, 2]")) s.frequency_penalty = float(*p);
  if (auto r = f.number("repetition_penalty", 0, 100, "a number in (0, 100]")) {
    if (*r <= 0) throw invalid("repetition_penalty", "repetition_penalty: expected a number in (0, 100], found 0");
    s.repetition_penalty = float(*r);
  }
  parse_logit_bias(f, d.vocab, s);
  s.seed = parse_seed(f);
  return s;
}

int parse_logprobs(const Fields& f, bool chat) {
  if (!chat) return int(f.integer("logprobs", 0, kMaxTopLogprobs).value_or(-1));
  const bool wanted = f.boolean("logprobs").value_or(false);
  const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs);
  if (top && !wanted) throw invalid("top_logprobs", "top_logprobs: needs \"logprobs\": true");
  return wanted ? int(top.value_or(0)) : -1;
}

// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: the schema's grammar.
grammar::Grammar json_schema_format(const Fields& format) {
  const json* spec = format.get("json_schema");
  if (!spec || !spec->is_object())
    throw invalid("response_format.json_schema", "response_format.json_schema: expected an object with \"name\" and "
                                                 "\"schema\", found " + (spec ? type_name(*spec) : "none"));
  const Fields fields(*spec, "response_format.json_schema");
  fields.string("name");     // type-checked only: the name plays no part in decoding
  fields.boolean("strict");  // type-checked only: the schema is always kept, strict or not
  const json* schema = fields.get("schema");
  if (!schema) throw invalid("response_format.json_schema.schema", "response_format.json_schema.schema: expected a JSON schema, found none");
  return compile_schema(*schema, "response_format.json_schema.schema");
}

// The grammar response_format asks for into `g` (none for text).
void parse_response_format(const Fields& f, GenerationFields& g) {
  const json* v = f.get("response_format");
  if (!v) return;
  if (!v->is_object()) throw invalid("response_format", "response_format: expected an object, found " + type_name(*v));
  const Fields format(*v, "response_format");
  const std::string type = format.string("type").value_or("");
  if (type == "text") return;
  g.grammar_key = "response_format " + dump(*v);
  if (type == "json_object") g.grammar = std::make_shared<grammar::Grammar>(grammar::json_object_grammar());
  else if (type == "json_schema") g.grammar = std::make_shared<grammar::Grammar>(json_schema_format(format));
  else throw invalid("response_format.type", "response_format.type: expected \"text\", \"json_object\" or \"json_schema\", found " +
                                            (type.empty() ? std::string("none") : "'" + type + "'"));
}

}  // namespace

void check_model_name(const Fields& body, const std::string& served) {
  const auto model = body.string("model");
  if (model && *model != served)
    throw ApiError(404, "model '" + *model + "' is not served here; this server serves '" + served + "'", "model",
                   "model_not_found");
}

GenerationFields parse_generation_fields(const json& body, const RequestDefaults& d, bool chat) {
  const Fields f(body, "");
  check_model_name(f, d.model_name);
  if (f.integer("n", 1, 1 << 20).value_or(1) != 1)
    throw invalid("n", "n: only 1 choice per request is supported");
  GenerationFields g;
  parse_response_format(f, g);
  g.stream = f.boolean("stream").value_or(false);
  if (const json* options = f.get("stream_options")) {
    if (!g.stream) throw invalid("stream_options", "stream_options: only allowed with \"stream\": true");
    g.include_usage = Fields(*options, "stream_options").boolean("include_usage").value_or(false);
  }
  const auto max_tokens = f.integer("max_tokens", 1, kMaxTokensLimit);
  const auto max_completion = chat ? f.integer("max_completion_tokens", 1, kMaxTokensLimit) : std::nullopt;
  g.max_tokens = int(max_completion.value_or(max_tokens.value_or(d.max_tokens)));
  g.stops = parse_stops(f);
  g.sampling = parse_sampling(f, d);
  g.logprobs = parse_logprobs(f, chat);
  return g;
}

}  // namespace petrel::server
