// Reads tokenizer.json into a Tokenizer, rejecting what Petrel does not implement by name.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_parts.h"

namespace petrel {
namespace {

using nlohmann::json;

// The decoder must turn byte-level symbols back into bytes; nothing else is implemented.
void check_decoder(const json& j) {
  if (j.is_null()) throw Error("tokenizer.json: \"decoder\" is null; a ByteLevel decoder is required");
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return;
  if (type == "Sequence" && j.at("decoders").size() == 1) return check_decoder(j["decoders"][0]);
  throw Error("tokenizer.json: decoder type '" + type + "' is not supported (expected ByteLevel)");
}

// Post-processors only act with add_special_tokens=True, which Petrel never uses; reject the
// unknown ones anyway so that a surprising file is noticed.
void check_post_processor(const json& j) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "ByteLevel" || type == "TemplateProcessing") return;
  if (type == "Sequence") {
    for (const auto& child : j.at("processors")) check_post_processor(child);
    return;
  }
  throw Error("tokenizer.json: post_processor type '" + type +
              "' is not supported (supported: ByteLevel, TemplateProcessing, Sequence)");
}

// A merge is written either as "left right" or as ["left", "right"].
std::pair<std::string, std::string> merge_parts(const json& m, size_t rank) {
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ', 1);
    if (space != std::string::npos && s.find(' ', space + 1) == std::string::npos)
      return {s.substr(0, space), s.substr(space + 1)};
  }
  throw Error("tokenizer.json: model.merges[" + std::to_string(rank) + "] = " + m.dump() +
              " is neither \"left right\" nor [left, right]");
}

// Parses tokenizer.json, moving the entries of model.vocab and model.merges into `tables`
// as they are read instead of into the tree.
json parse_document(std::string_view text, tokenizer::BpeTables& tables) {
  std::string keys[4];
  auto in = [&](const char* field) { return keys[1] == "model" && keys[2] == field; };
  return json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key) {
      if (depth < 4) keys[depth] = parsed.get<std::string>();
      return true;
    }
    if (depth != 3) return true;
    if (event == json::parse_event_t::value && in("vocab")) {
      if (!parsed.is_number_unsigned())
        throw Error("tokenizer.json: model.vocab[\"" + keys[3] + "\"] must be a non-negative integer id");
      tables.vocab.emplace_back(keys[3], parsed.get<uint32_t>());
      return false;
    }
    const bool merge_done = event == json::parse_event_t::value || event == json::parse_event_t::array_end;
    if (merge_done && in("merges")) {
      tables.merges.push_back(merge_parts(parsed, tables.merges.size()));
      return false;
    }
    return true;
  });
}

std::vector<tokenizer::AddedToken> read_added_tokens(const json& list) {
  std::vector<tokenizer::AddedToken> out;
  for (const auto& t : list) {
    tokenizer::AddedToken a;
    a.id = t.at("id").get<uint32_t>();
    a.content = t.at("content").get<std::string>();
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.normalized = t.value("normalized", true);
    a.special = t.value("special", false);
    if (a.content.empty()) throw Error("tokenizer.json: added token " + std::to_string(a.id) + " has empty content");
    out.push_back(std::move(a));
  }
  return out;
}

// Special tokens first, then the others, each in file order: the order Hugging Face builds its
// matchers in, which decides between equally long matches.
void build_matchers(Tokenizer::Impl& impl, const std::vector<tokenizer::AddedToken>& added) {
  std::vector<tokenizer::AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (bool special : {true, false}) {
    for (const auto& a : added) {
      if (a.special != special) continue;
      if (a.normalized) {
        normalized.push_back(a);
        normalized_patterns.push_back(impl.normalizer.apply(a.content));
      } else {
        raw.push_back(a);
        raw_patterns.push_back(a.content);
      }
    }
  }
  impl.raw_added = tokenizer::AddedTokenMatcher(std::move(raw), std::move(raw_patterns));
  impl.normalized_added = tokenizer::AddedTokenMatcher(std::move(normalized), std::move(normalized_patterns));
}

void set_token(Tokenizer::Impl& impl, uint32_t id, std::string bytes, bool special) {
  if (id >= impl.tokens.size()) impl.tokens.resize(id + 1);
  impl.tokens[id] = {std::move(bytes), true, special};
}

void build_decode_table(Tokenizer::Impl& impl, const std::vector<tokenizer::AddedToken>& added) {
  impl.tokens.reserve(impl.model.vocab().size() + added.size());
  for (const auto& [token, id] : impl.model.vocab()) set_token(impl, id, byte_level::decoder_bytes(token), false);
  for (const auto& a : added) {
    set_token(impl, a.id, byte_level::decoder_bytes(a.content), a.special);
    impl.added_by_content[a.content] = a.id;
  }
}

}  // namespace

Tokenizer Tokenizer::from_parts(Parts&& parts, const std::string& source) {
  try {
    auto impl = std::make_unique<Impl>();
    impl->normalizer = tokenizer::Normalizer::from_json(parts.normalizer);
    impl->pre_tokenizer = tokenizer::PreTokenizer::from_json(parts.pre_tokenizer);
    if (!impl->pre_tokenizer.has_byte_level())
      throw Error("tokenizer.json: pre_tokenizer has no ByteLevel step; only byte-level BPE is supported");
    impl->model = tokenizer::BpeModel::build(parts.model, std::move(parts.tables));
    build_matchers(*impl, parts.added);
    build_decode_table(*impl, parts.added);
    return Tokenizer(std::move(impl));
  } catch (const json::exception& e) {
    throw Error(source + ": malformed tokenizer: " + e.what());
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& source) {
  Parts parts;
  try {
    const json j = parse_document(json_text, parts.tables);
    parts.normalizer = j.value("normalizer", json());
    parts.pre_tokenizer = j.value("pre_tokenizer", json());
    parts.model = j.at("model");
    check_decoder(j.value("decoder", json()));
    check_post_processor(j.value("post_processor", json()));
    parts.added = read_added_tokens(j.value("added_tokens", json::array()));
  } catch (const json::exception& e) {
    throw Error(source + ": malformed tokenizer.json: " + e.what());
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  return from_parts(std::move(parts), source);
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path.string() + " (a Hugging Face tokenizer folder holds tokenizer.json)");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path.string());
}

}  // namespace petrel
