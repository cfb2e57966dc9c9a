// Jinja2's tests, the Python methods templates call on str/dict/list values, and the globals
// Hugging Face adds (raise_exception, strftime_now).
#include <algorithm>
#include <ctime>
#include <functional>
#include <map>

#include "tokenizer/jinja_args.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_pystr.h"
#include "tokenizer/utf8.h"

namespace petrel::jinja {
namespace {

using Test = std::function<bool(const Value&, CallArgs&)>;
using Method = std::function<Value(const Value&, CallArgs&)>;

bool is_int(const Value& v) { return v.kind == Value::Kind::Int; }

int64_t require_int(const Value& v, const char* test) {
  if (v.kind == Value::Kind::Int) return v.integer;
  if (v.kind == Value::Kind::Bool) return v.boolean;
  throw std::runtime_error(std::string("TypeError: test '") + test + "' needs an integer, got " + type_name(v));
}

// Python `in`: substring, element or key membership.
bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!item.is_string())
        throw std::runtime_error("TypeError: 'in <string>' requires string as left operand, not " + type_name(item));
      return container.s().find(item.s()) != std::string::npos;
    case Value::Kind::List:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& e) { return equals(e, item); });
    case Value::Kind::Dict:
      return item.is_string() && container.find(item.s()) != nullptr;
    default:
      throw std::runtime_error("TypeError: argument of type '" + type_name(container) + "' is not iterable");
  }
}

Test unary(std::function<bool(const Value&)> fn, const char* name) {
  return [fn, name](const Value& v, CallArgs& a) {
    Args(a, name, {});
    return fn(v);
  };
}

Test binary(std::function<bool(const Value&, const Value&)> fn, const char* name) {
  return [fn, name](const Value& v, CallArgs& a) { return fn(v, Args(a, name, {"other"}).required(0)); };
}

const std::map<std::string, Test>& tests() {
  auto eq = binary([](const Value& a, const Value& b) { return equals(a, b); }, "eq");
  auto ne = binary([](const Value& a, const Value& b) { return !equals(a, b); }, "ne");
  auto lt = binary([](const Value& a, const Value& b) { return less(a, b); }, "lt");
  auto le = binary([](const Value& a, const Value& b) { return less(a, b) || equals(a, b); }, "le");
  auto gt = binary([](const Value& a, const Value& b) { return less(b, a); }, "gt");
  auto ge = binary([](const Value& a, const Value& b) { return less(b, a) || equals(a, b); }, "ge");
  static const std::map<std::string, Test> table = {
      {"defined", unary([](const Value& v) { return !v.is_undefined(); }, "defined")},
      {"undefined", unary([](const Value& v) { return v.is_undefined(); }, "undefined")},
      {"none", unary([](const Value& v) { return v.is_none(); }, "none")},
      {"string", unary([](const Value& v) { return v.is_string(); }, "string")},
      {"number", unary([](const Value& v) { return v.is_number(); }, "number")},
      {"integer", unary(is_int, "integer")},
      {"float", unary([](const Value& v) { return v.kind == Value::Kind::Float; }, "float")},
      {"boolean", unary([](const Value& v) { return v.kind == Value::Kind::Bool; }, "boolean")},
      {"true", unary([](const Value& v) { return v.kind == Value::Kind::Bool && v.boolean; }, "true")},
      {"false", unary([](const Value& v) { return v.kind == Value::Kind::Bool && !v.boolean; }, "false")},
      {"mapping", unary([](const Value& v) { return v.kind == Value::Kind::Dict; }, "mapping")},
      {"iterable", unary([](const Value& v) {
         return v.is_undefined() || v.is_string() || v.kind == Value::Kind::List || v.kind == Value::Kind::Dict;
       }, "iterable")},
      {"sequence", unary([](const Value& v) {
         return v.is_undefined() || v.is_string() || v.kind == Value::Kind::List || v.kind == Value::Kind::Dict;
       }, "sequence")},
      {"callable", unary([](const Value& v) { return v.kind == Value::Kind::Callable; }, "callable")},
      {"odd", unary([](const Value& v) { return require_int(v, "odd") % 2 != 0; }, "odd")},
      {"even", unary([](const Value& v) { return require_int(v, "even") % 2 == 0; }, "even")},
      {"divisibleby", binary([](const Value& a, const Value& b) {
         const int64_t d = require_int(b, "divisibleby");
         if (d == 0) throw std::runtime_error("ZeroDivisionError: integer modulo by zero");
         return require_int(a, "divisibleby") % d == 0;
       }, "divisibleby")},
      {"lower", unary([](const Value& v) { return pystr::is_lower(to_str(v)); }, "lower")},
      {"upper", unary([](const Value& v) { return pystr::is_upper(to_str(v)); }, "upper")},
      {"in", binary([](const Value& a, const Value& b) { return contains(b, a); }, "in")},
      {"sameas", binary([](const Value& a, const Value& b) {
         // Python identity: singletons and small values compare by value, containers by storage.
         if (a.kind != b.kind) return false;
         if (a.kind == Value::Kind::List) return a.list == b.list;
         if (a.is_mapping()) return a.dict == b.dict;
         return equals(a, b);
       }, "sameas")},
      {"eq", eq}, {"equalto", eq}, {"==", eq}, {"ne", ne}, {"!=", ne},
      {"lt", lt}, {"lessthan", lt}, {"<", lt}, {"le", le}, {"<=", le},
      {"gt", gt}, {"greaterthan", gt}, {">", gt}, {"ge", ge}, {">=", ge},
  };
  return table;
}

std::optional<std::string> optional_string(const Args& args, size_t index) {
  const Value* v = args.get(index);
  if (!v || v->is_none()) return std::nullopt;
  return args.string_or(index, "");
}

// startswith/endswith accept a string or a tuple of strings.
bool affix_matches(const Value& s, const Value& affix, bool prefix) {
  if (affix.kind == Value::Kind::List) {
    return std::any_of(affix.list->begin(), affix.list->end(), [&](const Value& a) { return affix_matches(s, a, prefix); });
  }
  if (!affix.is_string())
    throw std::runtime_error(std::string("TypeError: ") + (prefix ? "startswith" : "endswith") +
                             " first arg must be str or a tuple of str, not " + type_name(affix));
  const std::string& text = s.s();
  const std::string& a = affix.s();
  if (a.size() > text.size()) return false;
  return prefix ? text.compare(0, a.size(), a) == 0 : text.compare(text.size() - a.size(), a.size(), a) == 0;
}

Value strings(const std::vector<std::string>& parts) {
  List out;
  for (const auto& p : parts) out.push_back(Value::from(p));
  return Value::from(std::move(out));
}

Method str_predicate(const char* name, std::function<bool(const std::string&)> fn) {
  return [name, fn](const Value& s, CallArgs& a) {
    Args(a, name, {});
    return Value::from(fn(s.s()));
  };
}

Method str_map(const char* name, std::string (*fn)(std::string_view)) {
  return [name, fn](const Value& s, CallArgs& a) {
    Args(a, name, {});
    return Value::from(fn(s.s()));
  };
}

Method strip_method(const char* name, bool left, bool right) {
  return [=](const Value& s, CallArgs& a) {
    Args args(a, name, {"chars"});
    return Value::from(pystr::strip(s.s(), optional_string(args, 0), left, right));
  };
}

Method split_method(const char* name, bool from_right) {
  return [=](const Value& s, CallArgs& a) {
    Args args(a, name, {"sep", "maxsplit"});
    return strings(pystr::split(s.s(), optional_string(args, 0), args.int_or(1, -1), from_right));
  };
}

const std::map<std::string, Method>& string_methods() {
  static const std::map<std::string, Method> table = {
      {"startswith", [](const Value& s, CallArgs& a) { return Value::from(affix_matches(s, Args(a, "startswith", {"prefix"}).required(0), true)); }},
      {"endswith", [](const Value& s, CallArgs& a) { return Value::from(affix_matches(s, Args(a, "endswith", {"suffix"}).required(0), false)); }},
      {"strip", strip_method("strip", true, true)},
      {"lstrip", strip_method("lstrip", true, false)},
      {"rstrip", strip_method("rstrip", false, true)},
      {"split", split_method("split", false)},
      {"rsplit", split_method("rsplit", true)},
      {"splitlines", [](const Value& s, CallArgs& a) { Args(a, "splitlines", {}); return strings(pystr::splitlines(s.s())); }},
      {"lower", str_map("lower", pystr::lower)},
      {"upper", str_map("upper", pystr::upper)},
      {"title", str_map("title", pystr::title)},
      {"capitalize", str_map("capitalize", pystr::capitalize)},
      {"replace", [](const Value& s, CallArgs& a) {
         Args args(a, "replace", {"old", "new", "count"});
         return Value::from(pystr::replace(s.s(), args.string_or(0, ""), args.string_or(1, ""), args.int_or(2, -1)));
       }},
      {"find", [](const Value& s, CallArgs& a) { return Value::from(static_cast<int64_t>(pystr::find(s.s(), Args(a, "find", {"sub"}).string_or(0, "")))); }},
      {"count", [](const Value& s, CallArgs& a) { return Value::from(static_cast<int64_t>(pystr::count(s.s(), Args(a, "count", {"sub"}).string_or(0, "")))); }},
      {"join", [](const Value& s, CallArgs& a) {
         std::string out;
         bool first = true;
         for (const Value& item : iterate(Args(a, "join", {"iterable"}).required(0))) {
           if (!item.is_string()) throw std::runtime_error("TypeError: sequence item: expected str instance, " + type_name(item) + " found");
           if (!first) out += s.s();
           out += item.s();
           first = false;
         }
         return Value::from(out);
       }},
      {"isalpha", str_predicate("isalpha", [](const std::string& s) { return pystr::all_of(s, "alpha"); })},
      {"isdigit", str_predicate("isdigit", [](const std::string& s) { return pystr::all_of(s, "digit"); })},
      {"isspace", str_predicate("isspace", [](const std::string& s) { return pystr::all_of(s, "space"); })},
      {"isalnum", str_predicate("isalnum", [](const std::string& s) { return pystr::all_of(s, "alnum"); })},
      {"islower", str_predicate("islower", pystr::is_lower)},
      {"isupper", str_predicate("isupper", pystr::is_upper)},
  };
  return table;
}

const std::map<std::string, Method>& dict_methods() {
  static const std::map<std::string, Method> table = {
      {"items", [](const Value& d, CallArgs& a) {
         Args(a, "items", {});
         List pairs;
         for (const auto& [k, v] : *d.dict) pairs.push_back(Value::from(List{Value::from(k), v}, true));
         return Value::from(std::move(pairs));
       }},
      {"keys", [](const Value& d, CallArgs& a) { Args(a, "keys", {}); return Value::from(iterate(d)); }},
      {"values", [](const Value& d, CallArgs& a) {
         Args(a, "values", {});
         List values;
         for (const auto& [_, v] : *d.dict) values.push_back(v);
         return Value::from(std::move(values));
       }},
      {"get", [](const Value& d, CallArgs& a) {
         Args args(a, "get", {"key", "default"});
         const Value& key = args.required(0);
         const Value* found = key.is_string() ? d.find(key.s()) : nullptr;
         return found ? *found : args.value_or(1, Value::none());
       }},
  };
  return table;
}

const std::map<std::string, Method>& list_methods() {
  static const std::map<std::string, Method> table = {
      {"index", [](const Value& l, CallArgs& a) {
         const Value& x = Args(a, "index", {"value"}).required(0);
         for (size_t i = 0; i < l.list->size(); ++i)
           if (equals((*l.list)[i], x)) return Value::from(static_cast<int64_t>(i));
         throw std::runtime_error("ValueError: " + repr(x) + " is not in list");
       }},
      {"count", [](const Value& l, CallArgs& a) {
         const Value& x = Args(a, "count", {"value"}).required(0);
         return Value::from(static_cast<int64_t>(std::count_if(l.list->begin(), l.list->end(), [&](const Value& e) { return equals(e, x); })));
       }},
  };
  return table;
}

const std::map<std::string, Method>* methods_for(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return &string_methods();
    case Value::Kind::Dict: return &dict_methods();
    case Value::Kind::List: return &list_methods();
    default: return nullptr;
  }
}

Value range_fn(CallArgs& a) {
  Args args(a, "range", {"start", "stop", "step"});
  int64_t start = 0, stop = 0, step = args.int_or(2, 1);
  if (args.get(1)) {
    start = args.int_or(0, 0);
    stop = args.int_or(1, 0);
  } else {
    stop = args.int_or(0, 0);
  }
  if (step == 0) throw std::runtime_error("ValueError: range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 1'000'000) throw std::runtime_error("range() is limited to 1000000 items in templates");
    out.push_back(Value::from(i));
  }
  return Value::from(std::move(out));
}

Value keyword_dict(CallArgs& a, const char* name) {
  if (!a.positional.empty()) {
    if (a.positional.size() > 1 || !a.positional[0].is_mapping())
      throw std::runtime_error(std::string(name) + "() takes a mapping and/or keyword arguments");
  }
  Dict d = a.positional.empty() ? Dict{} : *a.positional[0].dict;
  for (auto& [k, v] : a.keyword) {
    auto it = std::find_if(d.begin(), d.end(), [&key = k](const auto& e) { return e.first == key; });
    if (it != d.end()) it->second = v;
    else d.emplace_back(k, v);
  }
  return Value::from(std::move(d));
}

}  // namespace

bool is_test(const std::string& name) { return tests().count(name) > 0; }

bool apply_test(const std::string& name, const Value& input, CallArgs& args) { return tests().at(name)(input, args); }

bool has_method(const Value& object, const std::string& name) {
  const auto* table = methods_for(object);
  return table && table->count(name);
}

Value call_method(const Value& object, const std::string& name, CallArgs& args) {
  const auto* table = methods_for(object);
  if (!table || !table->count(name)) throw std::runtime_error("unsupported method '" + name + "' on " + type_name(object));
  return table->at(name)(object, args);
}

std::vector<std::pair<std::string, Value>> global_functions() {
  return {
      {"range", Value::function("range", range_fn)},
      {"namespace", Value::function("namespace", [](CallArgs& a) {
         Value d = keyword_dict(a, "namespace");
         return Value::make_namespace(*d.dict);
       })},
      {"dict", Value::function("dict", [](CallArgs& a) { return keyword_dict(a, "dict"); })},
      {"raise_exception", Value::function("raise_exception", [](CallArgs& a) -> Value {
         throw TemplateRaised(to_str(Args(a, "raise_exception", {"message"}).required(0)));
       })},
      {"strftime_now", Value::function("strftime_now", [](CallArgs& a) {
         const std::string format = Args(a, "strftime_now", {"format"}).string_or(0, "");
         const std::time_t now = std::time(nullptr);
         std::tm local{};
         localtime_r(&now, &local);
         char buf[256];
         const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
         return Value::from(std::string(buf, n));
       })},
  };
}

}  // namespace petrel::jinja
