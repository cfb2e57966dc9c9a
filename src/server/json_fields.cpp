#include "server/json_fields.h"

#include <cmath>

#include "server/api_error.h"

namespace petrel::server {

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

// Where the parser is, kept from its events, as a client names fields ("messages[2].content").
class ParsePosition {
 public:
  // Follows one parser event; a container opened beyond `max_depth` levels throws JsonTooDeep.
  void follow(json::parse_event_t event, const json& parsed, int max_depth) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (int(levels_.size()) >= max_depth) throw JsonTooDeep(path(), max_depth);
        levels_.push_back({event == json::parse_event_t::array_start, "", 0});
        return;
      case json::parse_event_t::key: levels_.back().key = parsed.get<std::string>(); return;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        levels_.pop_back();
        return element_done();
      case json::parse_event_t::value: return element_done();
    }
  }

  // The value being parsed: the last key of each object, the next index of each array.
  std::string path() const {
    std::string out;
    for (const Level& level : levels_) {
      if (level.array) out += "[" + std::to_string(level.done) + "]";
      else out += (out.empty() ? "" : ".") + level.key;
    }
    return out;
  }

 private:
  struct Level {
    bool array;
    std::string key;  // objects: the key whose value is being parsed
    size_t done;      // arrays: elements parsed so far
  };
  void element_done() {
    if (!levels_.empty() && levels_.back().array) ++levels_.back().done;
  }

  std::vector<Level> levels_;
};

// nlohmann's message without its "[json.exception.out_of_range.406] " prefix.
std::string without_id(const std::string& what) {
  const size_t end = what.find("] ");
  return end == std::string::npos ? what : what.substr(end + 2);
}

json parse_following(std::string_view text, int max_depth, ParsePosition& position) {
  return json::parse(text, [&position, max_depth](int, json::parse_event_t event, json& parsed) {
    position.follow(event, parsed, max_depth);
    return true;
  });
}

}  // namespace

JsonTooDeep::JsonTooDeep(std::string path, int max_depth)
    : std::runtime_error("nests deeper than " + std::to_string(max_depth) + " levels" +
                         (path.empty() ? std::string() : " (at " + path + ")")),
      path_(std::move(path)) {}

json parse_json_capped(std::string_view text, int max_depth) {
  ParsePosition position;
  return parse_following(text, max_depth, position);
}

std::optional<json> try_parse_json(std::string_view text, int max_depth) {
  try {
    return parse_json_capped(text, max_depth);
  } catch (const json::exception&) {
    return std::nullopt;
  } catch (const JsonTooDeep&) {
    return std::nullopt;
  }
}

json parse_body(const std::string& body, int max_depth) {
  ParsePosition position;
  json parsed;
  try {
    parsed = parse_following(body, max_depth, position);
  } catch (const JsonTooDeep& e) {
    throw invalid(e.path(), e.path() + ": the request body nests deeper than " + std::to_string(max_depth) + " levels");
  } catch (const json::out_of_range& e) {  // a number beyond a double, e.g. 1e400
    const std::string field = position.path();
    throw ApiError(400, (field.empty() ? "the request body" : field) +
                            ": expected a number within the range of a double, found one beyond it: " + without_id(e.what()),
                   field, "invalid_json");
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!parsed.is_object()) throw ApiError(400, "the request body must be a JSON object, found " + type_name(parsed));
  return parsed;
}

std::string type_name(const json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number()) return "number";
  return value.type_name();
}

Fields::Fields(const json& object, std::string path) : object_(object), path_(std::move(path)) {
  if (!object_.is_object()) throw invalid(path_, path_ + ": expected an object, found " + type_name(object_));
}

const json* Fields::get(const char* key) const {
  const auto it = object_.find(key);
  return it == object_.end() || it->is_null() ? nullptr : &*it;
}

std::string Fields::name(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

std::optional<bool> Fields::boolean(const char* key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw invalid(name(key), name(key) + ": expected true or false, found " + type_name(*v));
  return v->get<bool>();
}

std::optional<std::string> Fields::string(const char* key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw invalid(name(key), name(key) + ": expected a string, found " + type_name(*v));
  return v->get<std::string>();
}

std::optional<double> Fields::number(const char* key, double lo, double hi, const char* range) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw invalid(name(key), name(key) + ": expected " + range + ", found " + type_name(*v));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) throw invalid(name(key), name(key) + ": expected " + range + ", found " + v->dump());
  return x;
}

std::optional<int64_t> Fields::integer(const char* key, int64_t lo, int64_t hi) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  // 2.0 is an integer to a JavaScript client; 2.5 is not.
  const bool integral = v->is_number_integer() || (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>());
  if (!integral) throw invalid(name(key), name(key) + ": expected " + range + ", found " + type_name(*v));
  const double as_double = v->get<double>();
  if (as_double < double(lo) || as_double > double(hi))
    throw invalid(name(key), name(key) + ": expected " + range + ", found " + v->dump());
  return v->is_number_unsigned() ? int64_t(v->get<uint64_t>()) : v->get<int64_t>();
}

}  // namespace petrel::server
