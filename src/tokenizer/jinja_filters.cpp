// Jinja2's built-in filters (the subset chat templates use) plus Hugging Face's tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

#include "tokenizer/jinja_args.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_pystr.h"
#include "tokenizer/utf8.h"

namespace petrel::jinja {
namespace {

using Filter = std::function<Value(const Value&, CallArgs&)>;

std::runtime_error type_error(const std::string& message) { return std::runtime_error("TypeError: " + message); }

std::string str_arg(const Value& v) { return to_str(v); }

// Jinja's attribute getter for map/sort/...: "a.b.0" walks attributes and indices.
Value get_path(const Value& v, const std::string& path) {
  Value cur = v;
  for (const auto& part : pystr::split(path, std::string("."), -1, false)) {
    if (cur.is_mapping()) {
      const Value* found = cur.find(part);
      cur = found ? *found : Value::undefined("object has no attribute '" + part + "'");
    } else if (cur.kind == Value::Kind::List && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      const size_t i = std::stoul(part);
      cur = i < cur.list->size() ? (*cur.list)[i] : Value::undefined("list object has no element " + part);
    } else {
      cur = Value::undefined("object has no attribute '" + part + "'");
    }
  }
  return cur;
}

// Sort key: lower-cased strings unless case_sensitive (Jinja's ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  return v.is_string() && !case_sensitive ? Value::from(pystr::lower(v.s())) : v;
}

size_t length_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return utf8::length(v.s());
    case Value::Kind::List: return v.list->size();
    case Value::Kind::Dict: return v.dict->size();
    default: throw type_error("object of type '" + type_name(v) + "' has no len()");
  }
}

Value f_length(const Value& v, CallArgs& a) {
  Args(a, "length", {});
  return Value::from(static_cast<int64_t>(length_of(v)));
}

Value f_first(const Value& v, CallArgs& a) {
  Args(a, "first", {});
  const List items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& v, CallArgs& a) {
  Args(a, "last", {});
  const List items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_join(const Value& v, CallArgs& a) {
  Args args(a, "join", {"d", "attribute"});
  const std::string sep = args.string_or(0, "");
  const Value* attribute = args.get(1);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute && !attribute->is_none() ? get_path(item, to_str(*attribute)) : item);
  }
  return Value::from(out);
}

Value f_default(const Value& v, CallArgs& a) {
  Args args(a, "default", {"default_value", "boolean"});
  const bool use_default = v.is_undefined() || (args.flag(1, false) && !truthy(v));
  return use_default ? args.value_or(0, Value::from("")) : v;
}

Value f_string_map(const Value& v, CallArgs& a, const char* name, std::string (*fn)(std::string_view)) {
  Args(a, name, {});
  return Value::from(fn(to_str(v)));
}

// Jinja's title filter capitalises after spaces, dashes and opening brackets.
std::string jinja_title(std::string_view s) {
  std::string out;
  bool word_start = true;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t begin = pos;
    const char32_t c = utf8::decode(s, pos);
    const std::string ch(s.substr(begin, pos - begin));
    const bool delimiter = utf8::is_python_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    out += delimiter ? ch : (word_start ? pystr::upper(ch) : pystr::lower(ch));
    word_start = delimiter;
  }
  return out;
}

Value f_trim(const Value& v, CallArgs& a) {
  Args args(a, "trim", {"chars"});
  const Value* chars = args.get(0);
  std::optional<std::string> set;
  if (chars && !chars->is_none()) set = to_str(*chars);
  return Value::from(pystr::strip(to_str(v), set, true, true));
}

Value f_replace(const Value& v, CallArgs& a) {
  Args args(a, "replace", {"old", "new", "count"});
  return Value::from(pystr::replace(to_str(v), str_arg(args.required(0)), str_arg(args.required(1)), args.int_or(2, -1)));
}

Value f_list(const Value& v, CallArgs& a) {
  Args(a, "list", {});
  return Value::from(iterate(v));
}

// Python int(): accepts surrounding whitespace and underscores between digits.
std::optional<int64_t> parse_int(const std::string& text, int base) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(s[i] == '_' && i > 0 && i + 1 < s.size())) digits += s[i];
  if (digits.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno || *end) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& text) {
  const std::string s = pystr::strip(text, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end) return std::nullopt;
  return v;
}

Value f_int(const Value& v, CallArgs& a) {
  Args args(a, "int", {"default", "base"});
  const Value fallback = args.value_or(0, Value::from(0));
  switch (v.kind) {
    case Value::Kind::Bool: return Value::from(static_cast<int64_t>(v.boolean));
    case Value::Kind::Int: return v;
    case Value::Kind::Float: return std::isfinite(v.number) ? Value::from(static_cast<int64_t>(v.number)) : fallback;
    case Value::Kind::String: {
      if (auto i = parse_int(v.s(), static_cast<int>(args.int_or(1, 10)))) return Value::from(*i);
      if (auto d = parse_float(v.s()); d && std::isfinite(*d)) return Value::from(static_cast<int64_t>(*d));
      return fallback;
    }
    default: return fallback;
  }
}

Value f_float(const Value& v, CallArgs& a) {
  Args args(a, "float", {"default"});
  const Value fallback = args.value_or(0, Value::from(0.0));
  if (v.is_number()) return Value::from(v.kind == Value::Kind::Float ? v.number : static_cast<double>(v.kind == Value::Kind::Bool ? v.boolean : v.integer));
  if (v.is_string())
    if (auto d = parse_float(v.s())) return Value::from(*d);
  return fallback;
}

Value f_abs(const Value& v, CallArgs& a) {
  Args(a, "abs", {});
  if (v.kind == Value::Kind::Int) return Value::from(v.integer < 0 ? -v.integer : v.integer);
  if (v.kind == Value::Kind::Bool) return Value::from(static_cast<int64_t>(v.boolean));
  if (v.kind == Value::Kind::Float) return Value::from(std::fabs(v.number));
  throw type_error("bad operand type for abs(): '" + type_name(v) + "'");
}

// Python round(x, n): correctly rounded from the binary value, ties to even.
double python_round(double x, int64_t digits) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(digits, 0, 300)), x);
  return std::strtod(buf, nullptr);
}

Value f_round(const Value& v, CallArgs& a) {
  Args args(a, "round", {"precision", "method"});
  const int64_t precision = args.int_or(0, 0);
  const std::string method = args.string_or(1, "common");
  if (!v.is_number()) throw type_error("type " + type_name(v) + " doesn't define __round__ method");
  const double x = v.kind == Value::Kind::Float ? v.number : static_cast<double>(v.kind == Value::Kind::Bool ? v.boolean : v.integer);
  if (method == "common") {
    if (v.kind != Value::Kind::Float && precision >= 0) return Value::from(static_cast<int64_t>(x));
    return Value::from(python_round(x, precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::from(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::from(std::floor(x * scale) / scale);
  throw std::runtime_error("round(): method must be 'common', 'ceil' or 'floor'");
}

Value f_string(const Value& v, CallArgs& a) {
  Args(a, "string", {});
  return Value::from(to_str(v));
}

Value f_safe(const Value& v, CallArgs& a) {
  Args(a, "safe", {});
  return v;
}

Value f_items(const Value& v, CallArgs& a) {
  Args(a, "items", {});
  if (v.is_undefined()) return Value::from(List{});
  if (!v.is_mapping()) throw type_error("Can only get item pairs from a mapping.");
  List pairs;
  for (const auto& [k, val] : *v.dict) pairs.push_back(Value::from(List{Value::from(k), val}, true));
  return Value::from(std::move(pairs));
}

Value f_reverse(const Value& v, CallArgs& a) {
  Args(a, "reverse", {});
  if (v.is_string()) return Value::from(pystr::reverse(v.s()));
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::from(std::move(items));
}

void stable_sort_by(List& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
}

Value f_sort(const Value& v, CallArgs& a) {
  Args args(a, "sort", {"reverse", "case_sensitive", "attribute"});
  List items = iterate(v);
  const bool case_sensitive = args.flag(1, false);
  const std::string attribute = args.string_or(2, "");
  stable_sort_by(items, [&](const Value& x) { return sort_key(attribute.empty() ? x : get_path(x, attribute), case_sensitive); },
                 args.flag(0, false));
  return Value::from(std::move(items));
}

Value f_dictsort(const Value& v, CallArgs& a) {
  Args args(a, "dictsort", {"case_sensitive", "by", "reverse"});
  CallArgs no_args;
  List pairs = *f_items(v, no_args).list;
  const bool by_value = args.string_or(1, "key") == "value";
  const bool case_sensitive = args.flag(0, false);
  stable_sort_by(pairs, [&](const Value& p) { return sort_key((*p.list)[by_value ? 1 : 0], case_sensitive); },
                 args.flag(2, false));
  return Value::from(std::move(pairs));
}

Value f_unique(const Value& v, CallArgs& a) {
  Args args(a, "unique", {"case_sensitive", "attribute"});
  const bool case_sensitive = args.flag(0, false);
  const std::string attribute = args.string_or(1, "");
  List out, seen;
  for (const Value& item : iterate(v)) {
    const Value key = sort_key(attribute.empty() ? item : get_path(item, attribute), case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::from(std::move(out));
}

Value f_extreme(const Value& v, CallArgs& a, bool want_max) {
  Args args(a, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  const bool case_sensitive = args.flag(0, false);
  const std::string attribute = args.string_or(1, "");
  const List items = iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  auto key = [&](const Value& x) { return sort_key(attribute.empty() ? x : get_path(x, attribute), case_sensitive); };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i)
    if (want_max ? less(key(items[best]), key(items[i])) : less(key(items[i]), key(items[best]))) best = i;
  return items[best];
}

Value add(const Value& x, const Value& y) {
  if (!x.is_number() || !y.is_number())
    throw type_error("unsupported operand type(s) for +: '" + type_name(x) + "' and '" + type_name(y) + "'");
  auto as_i = [](const Value& z) { return z.kind == Value::Kind::Bool ? int64_t{z.boolean} : z.integer; };
  if (x.kind != Value::Kind::Float && y.kind != Value::Kind::Float) return Value::from(as_i(x) + as_i(y));
  auto as_d = [&](const Value& z) { return z.kind == Value::Kind::Float ? z.number : static_cast<double>(as_i(z)); };
  return Value::from(as_d(x) + as_d(y));
}

Value f_sum(const Value& v, CallArgs& a) {
  Args args(a, "sum", {"attribute", "start"});
  const std::string attribute = args.string_or(0, "");
  Value total = args.value_or(1, Value::from(0));
  for (const Value& item : iterate(v)) total = add(total, attribute.empty() ? item : get_path(item, attribute));
  return total;
}

Value f_tojson(const Value& v, CallArgs& a) {
  Args args(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = args.flag(0, false);
  if (const Value* indent = args.get(1); indent && !indent->is_none()) {
    o.indent = static_cast<int>(args.int_or(1, 0));
    o.item_separator = ",";
  }
  if (const Value* sep = args.get(2); sep && !sep->is_none()) {
    if (sep->kind != Value::Kind::List || sep->list->size() != 2)
      throw type_error("tojson(): separators must be an (item_separator, key_separator) pair");
    o.item_separator = to_str((*sep->list)[0]);
    o.key_separator = to_str((*sep->list)[1]);
  }
  o.sort_keys = args.flag(3, false);
  try {
    return Value::from(to_json(v, o));
  } catch (const std::invalid_argument& e) {
    throw type_error(e.what());
  }
}

Value f_indent(const Value& v, CallArgs& a) {
  Args args(a, "indent", {"width", "first", "blank"});
  const Value width = args.value_or(0, Value::from(4));
  const std::string pad = width.is_string() ? width.s() : std::string(static_cast<size_t>(std::max<int64_t>(0, args.int_or(0, 4))), ' ');
  const bool first = args.flag(1, false), blank = args.flag(2, false);
  const std::vector<std::string> lines = pystr::splitlines(to_str(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    const bool indent = i == 0 ? first : (blank || !lines[i].empty());
    out += (indent ? pad : "") + lines[i];
  }
  return Value::from(out);
}

Value f_wordcount(const Value& v, CallArgs& a) {
  Args(a, "wordcount", {});
  const std::string s = to_str(v);
  int64_t words = 0;
  bool in_word = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t c = utf8::decode(s, pos);
    const bool w = utf8::is_word_char(c) || c == '_';
    words += w && !in_word;
    in_word = w;
  }
  return Value::from(words);
}

// map: either map(attribute='x') or map('filter', args...).
Value f_map(const Value& v, CallArgs& a) {
  List out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [key, val] : a.keyword) {
    if (key == "attribute") attribute = &val;
    else if (key == "default") fallback = &val;
    else throw std::runtime_error("map() got an unexpected keyword argument '" + key + "'");
  }
  if (attribute) {
    for (const Value& item : iterate(v)) {
      Value got = get_path(item, to_str(*attribute));
      out.push_back(got.is_undefined() && fallback ? *fallback : got);
    }
    return Value::from(std::move(out));
  }
  if (a.positional.empty()) throw std::runtime_error("map() requires a filter name or attribute=");
  const std::string filter = to_str(a.positional[0]);
  if (!is_filter(filter)) throw std::runtime_error("map(): unsupported filter '" + filter + "'");
  for (const Value& item : iterate(v)) {
    CallArgs rest{{a.positional.begin() + 1, a.positional.end()}, {}};
    out.push_back(apply_filter(filter, item, rest));
  }
  return Value::from(std::move(out));
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
Value f_select(const Value& v, CallArgs& a, bool keep, bool by_attribute) {
  if (!a.keyword.empty()) throw std::runtime_error("select-style filters take no keyword arguments");
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.empty()) throw std::runtime_error("selectattr/rejectattr need an attribute name");
    attribute = to_str(a.positional[next++]);
  }
  std::string test;
  if (next < a.positional.size()) test = to_str(a.positional[next++]);
  if (!test.empty() && !is_test(test)) throw std::runtime_error("unsupported test '" + test + "'");
  List out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attribute ? get_path(item, attribute) : item;
    CallArgs rest{{a.positional.begin() + static_cast<long>(next), a.positional.end()}, {}};
    const bool passed = test.empty() ? truthy(subject) : apply_test(test, subject, rest);
    if (passed == keep) out.push_back(item);
  }
  return Value::from(std::move(out));
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = {
      {"abs", f_abs},
      {"capitalize", [](const Value& v, CallArgs& a) { return f_string_map(v, a, "capitalize", pystr::capitalize); }},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"first", f_first},
      {"float", f_float},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", [](const Value& v, CallArgs& a) { return f_string_map(v, a, "lower", pystr::lower); }},
      {"map", f_map},
      {"max", [](const Value& v, CallArgs& a) { return f_extreme(v, a, true); }},
      {"min", [](const Value& v, CallArgs& a) { return f_extreme(v, a, false); }},
      {"reject", [](const Value& v, CallArgs& a) { return f_select(v, a, false, false); }},
      {"rejectattr", [](const Value& v, CallArgs& a) { return f_select(v, a, false, true); }},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", [](const Value& v, CallArgs& a) { return f_select(v, a, true, false); }},
      {"selectattr", [](const Value& v, CallArgs& a) { return f_select(v, a, true, true); }},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", [](const Value& v, CallArgs& a) { return f_string_map(v, a, "title", jinja_title); }},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", [](const Value& v, CallArgs& a) { return f_string_map(v, a, "upper", pystr::upper); }},
      {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

bool is_filter(const std::string& name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  return filters().at(name)(input, args);
}

}  // namespace petrel::jinja
