#include "generate/generation_config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace petrel {
namespace {

using json = nlohmann::json;

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  check(bool(in), "cannot open " + path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": malformed JSON: " + e.what());
  }
}

// A field of generation_config.json, type-checked with a message naming file and field.
struct Field {
  const json& j;
  const std::string& path;

  const json* get(const char* k) const { return j.contains(k) && !j[k].is_null() ? &j[k] : nullptr; }
  void number(const char* k, float& out) const {
    if (const json* v = get(k)) {
      check(v->is_number(), path + ": field '" + k + "' must be a number, found " + v->dump());
      out = v->get<float>();
    }
  }
  void integer(const char* k, int& out) const {
    if (const json* v = get(k)) {
      check(v->is_number_integer(), path + ": field '" + k + "' must be an integer, found " + v->dump());
      out = v->get<int>();
    }
  }
};

void add_ids(const json& v, const std::string& path, std::vector<int32_t>& out) {
  const auto add = [&](const json& e) {
    check(e.is_number_integer(), path + ": field 'eos_token_id' must be an integer or a list of integers, found " +
                                     v.dump());
    out.push_back(e.get<int32_t>());
  };
  if (v.is_array()) for (const json& e : v) add(e);
  else add(v);
}

// tokenizer_config.json's eos_token: a string, or {"content": string}.
std::optional<std::string> eos_token_text(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  const json j = read_json(path);
  if (!j.contains("eos_token")) return std::nullopt;
  const json& e = j["eos_token"];
  if (e.is_string()) return e.get<std::string>();
  if (e.is_object() && e.contains("content") && e["content"].is_string()) return e["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

GenerationDefaults load_generation_defaults(const std::filesystem::path& dir,
                                            const std::function<std::optional<int32_t>(const std::string&)>& eos_token_id) {
  GenerationDefaults d;
  const auto path = dir / "generation_config.json";
  if (std::filesystem::exists(path)) {
    const json j = read_json(path);
    const std::string where = path.string();
    check(j.is_object(), where + ": expected a JSON object");
    const Field f{j, where};
    bool do_sample = false;
    if (const json* v = f.get("do_sample")) {
      check(v->is_boolean(), where + ": field 'do_sample' must be true or false, found " + v->dump());
      do_sample = v->get<bool>();
    }
    SamplingParams& s = d.sampling;
    s.temperature = 1.0f;
    f.number("temperature", s.temperature);
    if (!do_sample) s.temperature = 0.0f;
    f.integer("top_k", s.top_k);
    f.number("top_p", s.top_p);
    f.number("min_p", s.min_p);
    f.number("repetition_penalty", s.repetition_penalty);
    if (const json* v = f.get("eos_token_id")) add_ids(*v, where, d.eos_ids);
    int max_new = 0;
    f.integer("max_new_tokens", max_new);
    if (max_new > 0) d.max_new_tokens = max_new;
  }
  if (const auto text = eos_token_text(dir))
    if (const auto id = eos_token_id(*text); id && std::find(d.eos_ids.begin(), d.eos_ids.end(), *id) == d.eos_ids.end())
      d.eos_ids.push_back(*id);
  return d;
}

}  // namespace petrel
