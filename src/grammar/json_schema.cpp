#include "grammar/json_schema.h"

#include <algorithm>
#include <set>

#include "grammar/json_text.h"
#include "grammar/number_range.h"
#include "grammar/pattern.h"
#include "grammar/rule_builder.h"

namespace petrel::grammar {
namespace {

const std::set<std::string> kKeywords = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "pattern",
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const std::set<std::string> kAnnotations = {"title", "description", "$schema", "$id", "$comment", "default",
                                            "examples", "deprecated", "readOnly", "writeOnly"};

// The formats as patterns that only match valid values (dates give February 28 days at most).
const std::map<std::string, std::string> kFormats = {
    {"date", R"(^\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))$)"},
    {"time", R"(^(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)$)"},
    {"date-time", R"(^\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)$)"},
    {"email", R"(^[A-Za-z0-9_+-]{1,32}(?:\.[A-Za-z0-9_+-]{1,32}){0,3}@[A-Za-z0-9]{1,32}(?:-[A-Za-z0-9]{1,32}){0,2}(?:\.[A-Za-z]{2,12}){1,3}$)"},
    {"uuid", R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)"},
};

// Most automaton states a whole schema may take (a rule may take kMaxRuleStates).
constexpr size_t kMaxGrammarStates = size_t(1) << 18;

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::string names(const std::map<std::string, std::string>& m) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

class SchemaCompiler::Impl {
 public:
  explicit Impl(const Json& root) : root_(root) {}

  // A string schema's characters, raw (the XML tool-call form's string parameters).
  int32_t raw_string(const Json& s, const std::string& path) {
    return memo(s.dump() + "|raw", path, [&] { return build_rule(path, raw_string_expr(s, path)); });
  }

  int32_t add(Rule rule) {
    rules_.push_back(std::move(rule));
    return int32_t(rules_.size()) - 1;
  }

  int32_t rule(const Json& s, const std::string& path) {
    return memo(s.dump(), path, [&] { return build(s, path); });
  }

  Grammar finish(int32_t root) { return Grammar{std::move(rules_), root}; }

  int32_t any_value() {
    return memo("<any>", "any value", [&] {
      return build_rule("any value", alt({call(any_object()), call(any_array()), string_text(0, -1),
                                          number_text({}, false), literal("true"), literal("false"), literal("null")}));
    });
  }

  int32_t any_object() {
    return memo("<object>", "any object", [&] {
      const Expr member = seq({string_text(0, -1), literal(":"), space(), call(any_value())});
      return members_rule("any object", member);
    });
  }

 private:
  // The rule for `key`, built once; its id exists before its body, so recursive $refs work.
  template <class Build>
  int32_t memo(const std::string& key, const std::string& path, Build build) {
    if (auto it = ids_.find(key); it != ids_.end()) return it->second;
    const auto id = int32_t(rules_.size());
    ids_[key] = id;
    rules_.emplace_back();
    try {
      Rule r = build();
      states_ += r.states.size();
      check(states_ <= kMaxGrammarStates, "the schema needs more than " + std::to_string(kMaxGrammarStates) +
                                              " automaton states in all");
      rules_[size_t(id)] = std::move(r);
    } catch (const SchemaError&) {
      throw;
    } catch (const std::exception& e) {
      throw SchemaError(path, e.what());
    }
    return id;
  }

  // "{}" or "{m, m, ...}" for a member expression m.
  static Rule members_rule(const std::string& name, const Expr& member) {
    return build_rule(name, seq({literal("{"), optional(seq({member, repeat(seq({literal(","), space(), member}), 0, -1)})),
                                 literal("}")}));
  }

  int32_t any_array() {
    return memo("<array>", "any array", [&] {
      const Expr item = call(any_value());
      return build_rule("any array", seq({literal("["), optional(seq({item, repeat(seq({literal(","), space(), item}), 0, -1)})),
                                          literal("]")}));
    });
  }

  static void check_keywords(const Json& s, const std::string& path) {
    for (const auto& [key, value] : s.items()) {
      if (kKeywords.count(key) || kAnnotations.count(key)) continue;
      throw SchemaError(path, "the keyword '" + key + "' is not supported");
    }
  }

  static int64_t count(const Json& s, const char* key, const std::string& path, int64_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw SchemaError(path, std::string(key) + ": expected a non-negative integer, found " + v.dump());
    if (v.get<int64_t>() > kMaxCount)
      throw SchemaError(path, std::string(key) + ": at most " + std::to_string(kMaxCount) + " is supported, found " + v.dump());
    return v.get<int64_t>();
  }

  Rule build(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw SchemaError(path, "the schema false allows no value");
      return build_rule(path, call(any_value()));
    }
    if (!s.is_object()) throw SchemaError(path, "expected a schema (an object or a boolean), found " + s.dump());
    check_keywords(s, path);
    if (s.contains("$ref")) {
      const Json& target = resolve(s, path);
      std::string ref_path = s["$ref"].get<std::string>().substr(1);  // "/$defs/a" -> "$defs.a"
      std::replace(ref_path.begin(), ref_path.end(), '/', '.');
      return build_rule(path, call(rule(target, ref_path.empty() ? "" : ref_path.substr(1))));
    }
    if (s.contains("const")) return build_rule(path, literal(s["const"].dump()));
    if (s.contains("enum")) return build_rule(path, enum_expr(s, path));
    for (const char* key : {"anyOf", "oneOf"})
      if (s.contains(key)) return build_rule(path, any_of(s, key, path));
    const std::vector<std::string> types = types_of(s, path);
    if (types.empty()) return build_rule(path, call(any_value()));
    if (types.size() == 1 && types[0] == "object") return object_rule(s, path);
    if (types.size() == 1 && types[0] == "array") return array_rule(s, path);
    std::vector<Expr> options;
    for (const std::string& t : types) options.push_back(type_expr(s, t, path));
    return build_rule(path, alt(std::move(options)));
  }

  // The schema a "$ref" names; nothing but annotations may stand beside it.
  const Json& resolve(const Json& s, const std::string& path) {
    for (const auto& [key, value] : s.items())
      if (key != "$ref" && key != "$defs" && key != "definitions" && !kAnnotations.count(key))
        throw SchemaError(path, "the keyword '" + key + "' beside $ref is not supported");
    const Json& ref = s["$ref"];
    if (!ref.is_string() || !ref.get<std::string>().starts_with("#"))
      throw SchemaError(path, "$ref: only local references (\"#/$defs/...\") are supported, found " + ref.dump());
    try {
      return root_.at(Json::json_pointer(ref.get<std::string>().substr(1)));
    } catch (const std::exception&) {
      throw SchemaError(path, "$ref: " + ref.get<std::string>() + " names nothing in the schema");
    }
  }

  Expr enum_expr(const Json& s, const std::string& path) {
    const Json& values = s["enum"];
    if (!values.is_array() || values.empty()) throw SchemaError(path, "enum: expected a non-empty array, found " + values.dump());
    std::vector<Expr> options;
    for (const Json& v : values) options.push_back(literal(v.dump()));
    return alt(std::move(options));
  }

  Expr any_of(const Json& s, const char* key, const std::string& path) {
    for (const auto& [k, value] : s.items())
      if (k != key && k != "$defs" && k != "definitions" && !kAnnotations.count(k))
        throw SchemaError(path, "the keyword '" + k + "' beside " + key + " is not supported");
    const Json& list = s[key];
    if (!list.is_array() || list.empty())
      throw SchemaError(path, std::string(key) + ": expected a non-empty array of schemas, found " + list.dump());
    std::vector<Expr> options;
    for (size_t i = 0; i < list.size(); ++i)
      options.push_back(call(rule(list[i], join(path, std::string(key) + "[" + std::to_string(i) + "]"))));
    return alt(std::move(options));
  }

  // "type" as a list; without one, what the other keywords imply (none: any value).
  static std::vector<std::string> types_of(const Json& s, const std::string& path) {
    static const std::set<std::string> known = {"object", "array", "string", "number", "integer", "boolean", "null"};
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      for (const Json& one : t.is_array() ? t : Json::array({t})) {
        if (!one.is_string() || !known.count(one.get<std::string>()))
          throw SchemaError(path, "type: expected one of object, array, string, number, integer, boolean, null, found " +
                                      one.dump());
        types.push_back(one.get<std::string>());
      }
      if (types.empty()) throw SchemaError(path, "type: an empty list allows no value");
      return types;
    }
    const auto has = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
    };
    if (has({"properties", "required", "additionalProperties"})) return {"object"};
    if (has({"items", "prefixItems", "minItems", "maxItems"})) return {"array"};
    if (has({"minLength", "maxLength", "pattern", "format"})) return {"string"};
    if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) return {"number"};
    return {};
  }

  Expr type_expr(const Json& s, const std::string& type, const std::string& path) {
    if (type == "string") return string_expr(s, path, Spelling::Json);
    if (type == "number" || type == "integer") return number_text(bounds(s, path), type == "integer");
    if (type == "boolean") return alt({literal("true"), literal("false")});
    if (type == "null") return literal("null");
    const std::string key = s.dump() + "|" + type;
    if (type == "object") return call(memo(key, path, [&] { return object_rule(s, path); }));
    return call(memo(key, path, [&] { return array_rule(s, path); }));
  }

  // The string's characters (quoted in JSON spelling) under its length, pattern or format.
  Expr string_expr(const Json& s, const std::string& path, Spelling spelling) {
    const Expr quote = spelling == Spelling::Json ? literal("\"") : empty();
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern") && s.contains("format"))
      throw SchemaError(path, "pattern together with format is not supported");
    for (const char* key : {"pattern", "format"}) {
      if (!s.contains(key)) continue;
      if (lengths) throw SchemaError(path, std::string(key) + " together with minLength/maxLength is not supported");
      if (!s[key].is_string()) throw SchemaError(path, std::string(key) + ": expected a string, found " + s[key].dump());
    }
    if (s.contains("pattern")) return seq({quote, pattern_text(s["pattern"].get<std::string>(), spelling), quote});
    if (s.contains("format")) {
      const auto it = kFormats.find(s["format"].get<std::string>());
      if (it == kFormats.end())
        throw SchemaError(path, "format: " + s["format"].dump() + " is not supported (supported: " + names(kFormats) + ")");
      return seq({quote, pattern_text(it->second, spelling), quote});
    }
    const int64_t min = count(s, "minLength", path, 0), max = count(s, "maxLength", path, -1);
    return seq({quote, repeat(any_char(spelling), int(min), int(max)), quote});
  }

  // A "type": "string" schema written raw: its const or enum strings as they are, else string_expr.
  Expr raw_string_expr(const Json& s, const std::string& path) {
    check_keywords(s, path);
    std::vector<Expr> options;
    const Json values = s.contains("const") ? Json::array({s["const"]}) : s.value("enum", Json::array());
    for (const Json& v : values) {
      if (!v.is_string()) throw SchemaError(path, "enum: a string parameter's values must be strings, found " + v.dump());
      options.push_back(literal(v.get<std::string>()));
    }
    return options.empty() ? string_expr(s, path, Spelling::Raw) : alt(std::move(options));
  }

  static NumberBounds bounds(const Json& s, const std::string& path) {
    NumberBounds b;
    const auto read = [&](const char* key, std::optional<double>& into) {
      if (!s.contains(key) || s[key].is_boolean()) return false;
      if (!s[key].is_number()) throw SchemaError(path, std::string(key) + ": expected a number, found " + s[key].dump());
      into = s[key].get<double>();
      return true;
    };
    read("minimum", b.lo);
    read("maximum", b.hi);
    // exclusiveMinimum: a number (draft 6 on), or true making "minimum" exclusive (draft 4).
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean()) b.lo_exclusive = s["exclusiveMinimum"].get<bool>();
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean()) b.hi_exclusive = s["exclusiveMaximum"].get<bool>();
    std::optional<double> ex;
    if (read("exclusiveMinimum", ex) && (!b.lo || *ex >= *b.lo)) b.lo = ex, b.lo_exclusive = true;
    ex.reset();
    if (read("exclusiveMaximum", ex) && (!b.hi || *ex <= *b.hi)) b.hi = ex, b.hi_exclusive = true;
    return b;
  }

  // Properties in the schema's order, each present or (when not required) left out, with the
  // commas right: `first[k]` is before property k with nothing written yet, `later[k]` after some.
  Rule object_rule(const Json& s, const std::string& path) {
    const Json props = s.value("properties", Json::object());
    if (!props.is_object()) throw SchemaError(path, "properties: expected an object, found " + props.dump());
    const Json required = s.value("required", Json::array());
    if (!required.is_array()) throw SchemaError(path, "required: expected an array of names, found " + required.dump());
    const Json additional = s.value("additionalProperties", Json(props.empty()));
    struct Property {
      std::string name;
      Json schema;
      std::string path;
      bool required;
    };
    std::vector<Property> list;
    std::set<std::string> required_names;
    for (const Json& r : required) {
      if (!r.is_string()) throw SchemaError(path, "required: expected property names, found " + r.dump());
      required_names.insert(r.get<std::string>());
    }
    for (const auto& [name, schema] : props.items())
      list.push_back({name, schema, join(path, "properties." + name), required_names.count(name) > 0});
    for (const std::string& name : required_names) {
      if (props.contains(name)) continue;
      if (additional.is_boolean() && !additional.get<bool>())
        throw SchemaError(path, "required: '" + name + "' is not in properties and additionalProperties is false");
      list.push_back({name, additional, join(path, "additionalProperties"), true});
    }
    RuleBuilder b;
    const size_t n = list.size();
    std::vector<int> first(n + 1), later(n + 1);
    first[0] = b.state();
    later[0] = b.state();
    b.add(literal("{"), 0, first[0]);
    for (size_t k = 0; k < n; ++k) {
      first[k + 1] = b.state();
      later[k + 1] = b.state();
      const Expr member = seq({literal(Json(list[k].name).dump()), literal(":"), space(), call(rule(list[k].schema, list[k].path))});
      b.add(member, first[k], later[k + 1]);
      if (k > 0) b.add(seq({literal(","), space(), member}), later[k], later[k + 1]);
      if (list[k].required) continue;
      b.eps(first[k], first[k + 1]);
      if (k > 0) b.eps(later[k], later[k + 1]);
    }
    if (!(additional.is_boolean() && !additional.get<bool>())) {
      std::vector<std::string> declared;
      for (const Property& p : list) declared.push_back(p.name);
      const int key_start = b.state(), key_end = b.state();
      add_other_key(b, key_start, key_end, declared);
      const Expr value = seq({literal(":"), space(), call(rule(additional, join(path, "additionalProperties")))});
      const int member_end = b.state();
      b.add(value, key_end, member_end);
      b.eps(member_end, later[n]);
      b.eps(first[n], key_start);
      const int comma = b.state();
      b.add(seq({literal(","), space()}), later[n], comma);
      b.eps(comma, key_start);
    }
    const int end = b.state();
    b.add(literal("}"), first[n], end);
    b.add(literal("}"), later[n], end);
    return b.build(path.empty() ? "object" : path, end);
  }

  // A quoted key other than `declared`: printable ASCII without escapes (so that no spelling of
  // a declared name slips through), read along a trie of the declared names.
  static void add_other_key(RuleBuilder& b, int from, int to, const std::vector<std::string>& declared) {
    ByteSet plain = range_set(0x20, 0x7E);
    plain.reset('"');
    plain.reset('\\');
    const int free = b.state();  // the key has left every declared name
    b.bytes(free, free, plain);
    b.add(literal("\""), free, to);
    struct Node {
      std::map<uint8_t, int> next;
      bool name = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : declared) {
      size_t at = 0;
      for (char c : name) {
        auto [it, fresh] = trie[at].next.emplace(uint8_t(c), int(trie.size()));
        if (fresh) trie.emplace_back();
        at = size_t(it->second);
      }
      trie[at].name = true;
    }
    std::vector<int> state(trie.size());
    for (int& s : state) s = b.state();
    b.add(literal("\""), from, state[0]);
    for (size_t i = 0; i < trie.size(); ++i) {
      ByteSet others = plain;
      for (const auto& [c, child] : trie[i].next) {
        if (plain.test(c)) b.bytes(state[i], state[size_t(child)], range_set(c, c));
        others.reset(c);
      }
      b.bytes(state[i], free, others);
      if (!trie[i].name) b.add(literal("\""), state[i], to);
    }
  }

  Rule array_rule(const Json& s, const std::string& path) {
    const Json prefix = s.value("prefixItems", Json::array());
    if (!prefix.is_array()) throw SchemaError(path, "prefixItems: expected an array of schemas, found " + prefix.dump());
    const Json items = s.value("items", Json(true));
    const auto k = int64_t(prefix.size());
    const int64_t min = count(s, "minItems", path, 0);
    int64_t max = count(s, "maxItems", path, -1);
    if (items.is_boolean() && !items.get<bool>()) max = max < 0 ? k : std::min(max, k);
    const auto item = [&](int64_t i) {
      if (i < k) return call(rule(prefix[size_t(i)], join(path, "prefixItems[" + std::to_string(i) + "]")));
      return call(rule(items, join(path, "items")));
    };
    const int64_t chain = max >= 0 ? max : std::max<int64_t>({k, min, 1});
    RuleBuilder b;
    std::vector<int> after(size_t(chain) + 1);  // after[i]: i items written
    after[0] = b.state();
    b.add(literal("["), 0, after[0]);
    for (int64_t i = 0; i < chain; ++i) {
      after[size_t(i) + 1] = b.state();
      b.add(i == 0 ? item(i) : seq({literal(","), space(), item(i)}), after[size_t(i)], after[size_t(i) + 1]);
    }
    if (max < 0) b.add(seq({literal(","), space(), item(chain)}), after[size_t(chain)], after[size_t(chain)]);
    const int end = b.state();
    for (int64_t i = min; i <= chain; ++i) b.add(literal("]"), after[size_t(i)], end);
    return b.build(path.empty() ? "array" : path, end);
  }

  const Json& root_;
  std::vector<Rule> rules_;
  size_t states_ = 0;  // in all rules
  std::map<std::string, int32_t> ids_;
};

SchemaError::SchemaError(std::string path, std::string message)
    : Error(path.empty() ? message : path + ": " + message), path_(std::move(path)), message_(std::move(message)) {}

SchemaCompiler::SchemaCompiler(Json document)
    : document_(std::make_unique<Json>(std::move(document))), impl_(std::make_unique<Impl>(*document_)) {}
SchemaCompiler::~SchemaCompiler() = default;

int32_t SchemaCompiler::rule(const Json& schema, const std::string& path) { return impl_->rule(schema, path); }
int32_t SchemaCompiler::raw_string(const Json& schema, const std::string& path) { return impl_->raw_string(schema, path); }
int32_t SchemaCompiler::add(Rule rule) { return impl_->add(std::move(rule)); }
Grammar SchemaCompiler::finish(int32_t root) { return impl_->finish(root); }

Grammar json_schema_grammar(const Json& schema) {
  SchemaCompiler c(schema);
  return c.finish(c.rule(schema, ""));
}

Grammar json_object_grammar() {
  SchemaCompiler::Impl c(Json::object());
  return c.finish(c.any_object());
}

}  // namespace petrel::grammar
