#include "tokenizer/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tokenizer/utf8.h"

namespace petrel::jinja {
namespace {

double as_double(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Bool: return v.boolean ? 1 : 0;
    case Value::Kind::Int: return static_cast<double>(v.integer);
    default: return v.number;
  }
}

bool is_integral(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool; }

int64_t as_int(const Value& v) { return v.kind == Value::Kind::Bool ? (v.boolean ? 1 : 0) : v.integer; }

// Python's str.isprintable() for one character: not a control, format, separator (but ' '),
// surrogate, private-use or unassigned code point.
bool printable(char32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
      return false;
    default:
      return true;
  }
}

void append_hex(std::string& out, const char* prefix, uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%s%0*x", prefix, digits, value);
  out += buf;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = utf8::decode(s, pos);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (printable(cp)) utf8::append(out, cp);
    else if (cp < 0x100) append_hex(out, "\\x", cp, 2);
    else if (cp < 0x10000) append_hex(out, "\\u", cp, 4);
    else append_hex(out, "\\U", cp, 8);
  }
  out += quote;
  return out;
}

std::string sequence_repr(const Value& v) {
  std::string out = v.is_tuple ? "(" : "[";
  for (size_t i = 0; i < v.list->size(); ++i) {
    if (i) out += ", ";
    out += repr((*v.list)[i]);
  }
  if (v.is_tuple && v.list->size() == 1) out += ",";
  out += v.is_tuple ? ")" : "]";
  return out;
}

std::string dict_repr(const Dict& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) out += ", ";
    out += string_repr(d[i].first) + ": " + repr(d[i].second);
  }
  return out + "}";
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = utf8::decode(s, pos);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20) append_hex(out, "\\u", cp, 4);
        else if (!ensure_ascii || cp < 0x80) utf8::append(out, cp);
        else if (cp < 0x10000) append_hex(out, "\\u", cp, 4);
        else {  // a surrogate pair, as Python writes astral characters in ASCII JSON
          append_hex(out, "\\u", 0xD800 + ((cp - 0x10000) >> 10), 4);
          append_hex(out, "\\u", 0xDC00 + ((cp - 0x10000) & 0x3FF), 4);
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int depth);

void json_newline(std::string& out, const JsonOptions& o, int depth) {
  if (!o.indent) return;
  out += '\n';
  out.append(static_cast<size_t>(*o.indent) * depth, ' ');
}

void json_list(std::string& out, const List& items, const JsonOptions& o, int depth) {
  if (items.empty()) {
    out += "[]";
    return;
  }
  out += '[';
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += o.item_separator;
    json_newline(out, o, depth + 1);
    json_value(out, items[i], o, depth + 1);
  }
  json_newline(out, o, depth);
  out += ']';
}

void json_dict(std::string& out, const Dict& d, const JsonOptions& o, int depth) {
  if (d.empty()) {
    out += "{}";
    return;
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& e : d) entries.push_back(&e);
  if (o.sort_keys)
    std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += o.item_separator;
    json_newline(out, o, depth + 1);
    json_string(out, entries[i]->first, o.ensure_ascii);
    out += o.key_separator;
    json_value(out, entries[i]->second, o, depth + 1);
  }
  json_newline(out, o, depth);
  out += '}';
}

void json_value(std::string& out, const Value& v, const JsonOptions& o, int depth) {
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.integer); return;
    case Value::Kind::Float:
      if (std::isnan(v.number)) out += "NaN";
      else if (std::isinf(v.number)) out += v.number > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.number);
      return;
    case Value::Kind::String: json_string(out, v.s(), o.ensure_ascii); return;
    case Value::Kind::List: json_list(out, *v.list, o, depth); return;
    case Value::Kind::Dict: json_dict(out, *v.dict, o, depth); return;
    default: throw std::invalid_argument("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

int compare_sequences(const List& a, const List& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (less(a[i], b[i])) return -1;
    if (less(b[i], a[i])) return 1;
  }
  return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
}

}  // namespace

Value Value::undefined(std::string why) {
  Value v;
  v.str = std::make_shared<const std::string>(std::move(why));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::from(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.boolean = b;
  return v;
}
Value Value::from(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.integer = i;
  return v;
}
Value Value::from(double d) {
  Value v;
  v.kind = Kind::Float;
  v.number = d;
  return v;
}
Value Value::from(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.str = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::from(List items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  v.is_tuple = tuple;
  return v;
}
Value Value::from(Dict items) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::make_namespace(Dict items) {
  Value v = from(std::move(items));
  v.kind = Kind::Namespace;
  return v;
}
Value Value::function(std::string name, NativeFunction fn) {
  Value v;
  v.kind = Kind::Callable;
  v.callable = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

namespace {

// Values are walked recursively (printing, tojson, comparison, destruction): JSON nesting
// deeper than any chat conversation needs is refused here, not left to overflow the stack.
constexpr int kMaxJsonDepth = 256;

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth)
    throw std::invalid_argument("a template value nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::from(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::from(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::from(static_cast<double>(u));
      return Value::from(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::from(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::from(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::from(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json_at(e, depth + 1));
      return Value::from(std::move(items));
    }
    default: return Value::none();
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 1); }

const Value* Value::find(const std::string& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return v.is_tuple ? "tuple" : "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Callable: return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.boolean;
    case Value::Kind::Int: return v.integer != 0;
    case Value::Kind::Float: return v.number != 0;
    case Value::Kind::String: return !v.str->empty();
    case Value::Kind::List: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->empty();
    default: return true;
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined: case Value::Kind::None: return true;
    case Value::Kind::String: return a.s() == b.s();
    case Value::Kind::List:
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Value::Kind::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* other = b.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    case Value::Kind::Namespace: return a.dict == b.dict;
    case Value::Kind::Callable: return a.callable == b.callable;
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return as_int(a) < as_int(b);
    return as_double(a) < as_double(b);
  }
  if (a.is_string() && b.is_string()) return a.s() < b.s();  // UTF-8 byte order is code point order
  if (a.kind == Value::Kind::List && b.kind == Value::Kind::List && a.is_tuple == b.is_tuple)
    return compare_sequences(*a.list, *b.list) < 0;
  throw std::invalid_argument("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // shortest round-trip digits, e.g. "-1.2345e+16"
  const bool negative = sci[0] == '-';
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exponent = std::stoi(sci.substr(e + 1));
  const int point = exponent + 1;  // position of the decimal point within the digits
  const int n = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (point > 16 || point < -3) {  // Python's repr switches to exponent notation here
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (point <= 0) return out + "0." + std::string(-point, '0') + digits;
  if (point < n) return out + digits.substr(0, point) + "." + digits.substr(point);
  return out + digits + std::string(point - n, '0') + ".0";
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::String: return v.s();
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.boolean ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.integer);
    case Value::Kind::Float: return float_repr(v.number);
    case Value::Kind::String: return string_repr(v.s());
    case Value::Kind::List: return sequence_repr(v);
    case Value::Kind::Dict: return dict_repr(*v.dict);
    case Value::Kind::Namespace: return "<Namespace " + dict_repr(*v.dict) + ">";
    case Value::Kind::Callable: return "<function " + v.callable->name + ">";
  }
  return "";
}

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(out, v, options, 0);
  return out;
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return *v.list;
    case Value::Kind::Dict: {
      List keys;
      for (const auto& [k, _] : *v.dict) keys.push_back(Value::from(k));
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      size_t pos = 0;
      while (pos < v.s().size()) {
        const size_t begin = pos;
        utf8::decode(v.s(), pos);
        chars.push_back(Value::from(v.s().substr(begin, pos - begin)));
      }
      return chars;
    }
    default: throw std::invalid_argument("'" + type_name(v) + "' object is not iterable");
  }
}

}  // namespace petrel::jinja
