#include "server/json_fields.h"

#include <cmath>

#include "server/api_error.h"

namespace petrel::server {

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_body(const std::string& body, int max_depth) {
  json parsed;
  try {
    // Nested values are walked recursively later (templates, dumps): cap the depth while parsing.
    parsed = json::parse(body, [max_depth](int depth, json::parse_event_t, json&) {
      if (depth > max_depth)
        throw ApiError(400, "the request body nests deeper than " + std::to_string(max_depth) + " levels");
      return true;
    });
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past double's range
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
