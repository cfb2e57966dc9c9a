// JSON in and out of the server: request bodies parsed, responses serialised, and typed reads
// of a request's fields. A wrong type or value is an ApiError naming the field by its full path
// ("messages[2].content"); absent and null fields read as nullopt.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace petrel::server {

using json = nlohmann::ordered_json;

// Serialises what the server writes: invalid UTF-8 (never expected) becomes U+FFFD instead of throwing.
std::string dump(const json& value);

// Deepest nesting accepted in JSON text from clients or the model: parsed values are walked
// recursively afterwards (chat-template values, dumps), so the cap is enforced while parsing.
constexpr int kMaxJsonDepth = 64;

// JSON text nesting deeper than the cap; `path` names the value that crosses it ("a[0][0]").
class JsonTooDeep : public std::runtime_error {
 public:
  JsonTooDeep(std::string path, int max_depth);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Parses untrusted JSON text, refusing nesting deeper than `max_depth` levels while parsing
// (JsonTooDeep). Malformed text throws json::exception: parse_error, or out_of_range for a
// number beyond a double (1e400).
json parse_json_capped(std::string_view text, int max_depth = kMaxJsonDepth);
// The same, nullopt when the text is malformed or too deep (model output that may be JSON).
std::optional<json> try_parse_json(std::string_view text, int max_depth = kMaxJsonDepth);

// Parses a request body; malformed JSON, nesting deeper than `max_depth` and non-objects are
// 400s. Out-of-range numbers and too-deep values name their field.
json parse_body(const std::string& body, int max_depth = kMaxJsonDepth);

class Fields {
 public:
  // `path` is the object's own name ("" for the request body, "messages[0]" for a message).
  Fields(const json& object, std::string path);

  // The field's value, or null when absent or JSON null.
  const json* get(const char* key) const;
  // "messages[0].role" for key "role".
  std::string name(const char* key) const;

  std::optional<bool> boolean(const char* key) const;
  std::optional<std::string> string(const char* key) const;
  // A number in [lo, hi]; `range` describes it for the message ("a number in [0, 2]").
  std::optional<double> number(const char* key, double lo, double hi, const char* range) const;
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const;

 private:
  const json& object_;
  std::string path_;
};

// JSON type names as a client would say them: "string", "array", "object", "number", ...
std::string type_name(const json& value);

}  // namespace petrel::server
