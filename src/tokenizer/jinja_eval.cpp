// The tree-walking evaluator behind Template::render, with Jinja2's scoping rules: for-loop
// iterations and macro calls get their own scope; if-blocks do not.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_pystr.h"
#include "tokenizer/jinja_template.h"
#include "tokenizer/utf8.h"

namespace petrel::jinja {
namespace {

constexpr int kMaxCallDepth = 256;

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

std::runtime_error type_error(const std::string& m) { return std::runtime_error("TypeError: " + m); }

int64_t as_int(const Value& v) { return v.kind == Value::Kind::Bool ? int64_t{v.boolean} : v.integer; }
double as_double(const Value& v) { return v.kind == Value::Kind::Float ? v.number : static_cast<double>(as_int(v)); }
bool integral(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool; }

// An Undefined used where a value is needed fails with the reason it is undefined.
void require_defined(const Value& v) {
  if (v.is_undefined()) throw std::runtime_error("UndefinedError: " + v.s());
}

Value repeat(const Value& seq, int64_t times) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.s();
    return Value::from(out);
  }
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::from(std::move(out), seq.is_tuple);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  auto unsupported = [&] {
    return type_error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::from(a.s() + b.s());
    if (a.kind == Value::Kind::List && b.kind == Value::Kind::List && a.is_tuple == b.is_tuple) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::from(std::move(out), a.is_tuple);
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.kind == Value::Kind::List) && integral(b)) return repeat(a, as_int(b));
    if (integral(a) && (b.is_string() || b.kind == Value::Kind::List)) return repeat(b, as_int(a));
  }
  if (!a.is_number() || !b.is_number()) {
    if (op == "%" && a.is_string()) throw std::runtime_error("string formatting with '%' is not supported");
    throw unsupported();
  }
  const bool ints = integral(a) && integral(b);
  const int64_t x = as_int(a), y = as_int(b);
  const double dx = as_double(a), dy = as_double(b);
  if (op == "+") return ints ? Value::from(x + y) : Value::from(dx + dy);
  if (op == "-") return ints ? Value::from(x - y) : Value::from(dx - dy);
  if (op == "*") return ints ? Value::from(x * y) : Value::from(dx * dy);
  if (op == "/") {
    if (dy == 0) throw std::runtime_error("ZeroDivisionError: division by zero");
    return Value::from(dx / dy);
  }
  if (op == "//" || op == "%") {
    if (ints ? y == 0 : dy == 0) throw std::runtime_error("ZeroDivisionError: integer division or modulo by zero");
    if (ints) {  // Python rounds the quotient toward negative infinity
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return op == "//" ? Value::from(q) : Value::from(r);
    }
    const double q = std::floor(dx / dy);
    return op == "//" ? Value::from(q) : Value::from(dx - q * dy);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < y; ++i) r *= x;
      return Value::from(r);
    }
    return Value::from(std::pow(dx, dy));
  }
  throw std::runtime_error("unsupported operator '" + op + "'");
}

bool contains(const Value& container, const Value& item) {
  CallArgs args{{container}, {}};
  return apply_test("in", item, args);
}

Value compare(const std::string& op, const Value& a, const Value& b, bool negated) {
  if (op == "==") return Value::from(equals(a, b));
  if (op == "!=") return Value::from(!equals(a, b));
  if (op == "in") return Value::from(contains(b, a) != negated);
  require_defined(a);
  require_defined(b);
  if (op == "<") return Value::from(less(a, b));
  if (op == ">") return Value::from(less(b, a));
  if (op == "<=") return Value::from(less(a, b) || equals(a, b));
  return Value::from(less(b, a) || equals(a, b));  // ">="
}

std::optional<long> slice_bound(const Value& v) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (!integral(v)) throw type_error("slice indices must be integers or None");
  return static_cast<long>(as_int(v));
}

class Renderer {
 public:
  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const auto& stmt : body) {
      const Flow flow = exec_one(*stmt, scope, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  Flow exec_one(const Stmt& s, Scope& scope, std::string& out) {
    try {
      return dispatch(s, scope, out);
    } catch (const Error&) {
      throw;
    } catch (const TemplateRaised& e) {
      throw Error("chat template raised an exception at line " + std::to_string(s.line) + ": " + e.what());
    } catch (const std::exception& e) {
      fail(s.line, e.what());
    }
  }

  Flow dispatch(const Stmt& s, Scope& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text: out += s.text; return Flow::Normal;
      case Stmt::Kind::Print: out += to_str(eval(*s.expr, scope)); return Flow::Normal;
      case Stmt::Kind::If: return exec(truthy(eval(*s.expr, scope)) ? s.body : s.else_body, scope, out);
      case Stmt::Kind::For: return exec_for(s, scope, out);
      case Stmt::Kind::Set: assign(s.targets, eval(*s.expr, scope), scope); return Flow::Normal;
      case Stmt::Kind::SetAttr: set_attribute(s, scope); return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string captured;
        exec(s.body, scope, captured);
        scope.vars[s.targets[0]] = Value::from(captured);
        return Flow::Normal;
      }
      case Stmt::Kind::Macro: scope.vars[s.text] = make_macro(s, scope); return Flow::Normal;
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Generation: return exec(s.body, scope, out);
    }
    return Flow::Normal;
  }

  void assign(const std::vector<std::string>& targets, const Value& v, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size())
      throw std::runtime_error("ValueError: cannot unpack " + std::to_string(items.size()) + " values into " +
                               std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  void set_attribute(const Stmt& s, Scope& scope) {
    const Value* target = scope.lookup(s.targets[0]);
    if (!target || target->kind != Value::Kind::Namespace)
      throw std::runtime_error("cannot assign attribute '" + s.text + "' on '" + s.targets[0] +
                               "': only namespace() objects accept attribute assignment");
    const Value v = eval(*s.expr, scope);
    for (auto& [k, existing] : *target->dict)
      if (k == s.text) {
        existing = v;
        return;
      }
    target->dict->emplace_back(s.text, v);
  }

  Dict loop_info(const List& items, size_t i) {
    const auto n = static_cast<int64_t>(items.size()), k = static_cast<int64_t>(i);
    Dict loop = {
        {"index", Value::from(k + 1)}, {"index0", Value::from(k)}, {"revindex", Value::from(n - k)},
        {"revindex0", Value::from(n - k - 1)}, {"first", Value::from(k == 0)}, {"last", Value::from(k == n - 1)},
        {"length", Value::from(n)}, {"depth", Value::from(1)}, {"depth0", Value::from(0)},
    };
    if (i > 0) loop.emplace_back("previtem", items[i - 1]);
    if (i + 1 < items.size()) loop.emplace_back("nextitem", items[i + 1]);
    loop.emplace_back("cycle", Value::function("cycle", [k](CallArgs& a) {
      if (a.positional.empty()) throw std::runtime_error("loop.cycle() needs at least one value");
      return a.positional[static_cast<size_t>(k) % a.positional.size()];
    }));
    return loop;
  }

  Flow exec_for(const Stmt& s, Scope& scope, std::string& out) {
    List items;
    const Value iterable = eval(*s.expr, scope);
    if (iterable.is_none() || iterable.is_number())
      throw type_error("'" + type_name(iterable) + "' object is not iterable");
    for (const Value& item : iterate(iterable)) {
      if (s.filter) {
        Scope probe{{}, &scope};
        assign(s.targets, item, probe);
        if (!truthy(eval(*s.filter, probe))) continue;
      }
      items.push_back(item);
    }
    if (items.empty()) return exec(s.else_body, scope, out);
    for (size_t i = 0; i < items.size(); ++i) {
      Scope iteration{{}, &scope};
      assign(s.targets, items[i], iteration);
      iteration.vars["loop"] = Value::from(loop_info(items, i));
      if (exec(s.body, iteration, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s, Scope& defining) {
    const Stmt* macro = &s;
    Scope* parent = &defining;
    return Value::function(s.text, [this, macro, parent](CallArgs& args) { return call_macro(*macro, *parent, args); });
  }

  Value call_macro(const Stmt& m, Scope& parent, CallArgs& args) {
    if (args.positional.size() > m.targets.size())
      throw type_error("macro '" + m.text + "' takes not more than " + std::to_string(m.targets.size()) +
                       " argument(s)");
    if (++depth_ > kMaxCallDepth) throw std::runtime_error("macro recursion deeper than 256 calls");
    Scope local{{}, &parent};
    for (size_t i = 0; i < m.targets.size(); ++i) {
      const std::string& name = m.targets[i];
      if (i < args.positional.size()) {
        local.vars[name] = args.positional[i];
        continue;
      }
      local.vars[name] = Value::undefined("'" + name + "' is undefined");  // Jinja leaves missing arguments undefined
      for (const auto& [k, v] : args.keyword)
        if (k == name) local.vars[name] = v;
      if (std::none_of(args.keyword.begin(), args.keyword.end(), [&](const auto& kv) { return kv.first == name; }))
        for (const auto& [k, dflt] : m.defaults)
          if (k == name) local.vars[name] = eval(*dflt, local);
    }
    for (const auto& [k, _] : args.keyword)
      if (std::find(m.targets.begin(), m.targets.end(), k) == m.targets.end())
        throw type_error("macro '" + m.text + "' takes no keyword argument '" + k + "'");
    std::string out;
    exec(m.body, local, out);
    --depth_;
    return Value::from(out);
  }

  Value eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: {
        const Value* v = scope.lookup(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List items;
        for (const auto& item : e.items) items.push_back(eval(*item, scope));
        return Value::from(std::move(items), e.kind == Expr::Kind::Tuple);
      }
      case Expr::Kind::Dict: return eval_dict(e, scope);
      case Expr::Kind::Attr: return attribute(eval(*e.items[0], scope), e.name);
      case Expr::Kind::Item: return item(eval(*e.items[0], scope), eval(*e.items[1], scope));
      case Expr::Kind::Slice: return slice(e, scope);
      case Expr::Kind::Call: return call(e, scope);
      case Expr::Kind::Filter: {
        const Value input = eval(*e.items[0], scope);
        CallArgs args = arguments(e, scope, 1);
        return apply_filter(e.name, input, args);
      }
      case Expr::Kind::Test: {
        const Value input = eval(*e.items[0], scope);
        CallArgs args = arguments(e, scope, 1);
        return Value::from(apply_test(e.name, input, args) != e.negated);
      }
      case Expr::Kind::Unary: return unary(e.name, eval(*e.items[0], scope));
      case Expr::Kind::Binary: {
        const Value a = eval(*e.items[0], scope), b = eval(*e.items[1], scope);
        if (e.name == "~") return Value::from(to_str(a) + to_str(b));
        if (e.name == "==" || e.name == "!=" || e.name == "<" || e.name == ">" || e.name == "<=" || e.name == ">=" ||
            e.name == "in")
          return compare(e.name, a, b, e.negated);
        return arithmetic(e.name, a, b);
      }
      case Expr::Kind::And: {
        Value a = eval(*e.items[0], scope);
        return truthy(a) ? eval(*e.items[1], scope) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.items[0], scope);
        return truthy(a) ? a : eval(*e.items[1], scope);
      }
      case Expr::Kind::Cond:
        if (truthy(eval(*e.items[1], scope))) return eval(*e.items[0], scope);
        return e.items[2] ? eval(*e.items[2], scope) : Value::undefined("the conditional expression has no else branch");
    }
    return Value::undefined();
  }

  Value eval_dict(const Expr& e, Scope& scope) {
    Dict d;
    for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
      const Value key = eval(*e.items[i], scope);
      if (!key.is_string()) throw std::runtime_error("unsupported dict literal key of type " + type_name(key) + " (only strings)");
      Value v = eval(*e.items[i + 1], scope);
      auto it = std::find_if(d.begin(), d.end(), [&](const auto& kv) { return kv.first == key.s(); });
      if (it != d.end()) it->second = std::move(v);
      else d.emplace_back(key.s(), std::move(v));
    }
    return Value::from(std::move(d));
  }

  // Jinja's getattr: methods of str/dict/list first, then dict entries; otherwise undefined.
  Value attribute(const Value& obj, const std::string& name) {
    require_defined(obj);
    if (has_method(obj, name)) return bound_method(obj, name);
    if (obj.is_mapping()) {
      const Value* v = obj.find(name);
      if (v) return *v;
    }
    if (obj.is_string() || obj.kind == Value::Kind::List)
      return Value::undefined("unsupported " + type_name(obj) + " method or attribute '" + name + "'");
    return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
  }

  Value bound_method(const Value& obj, const std::string& name) {
    return Value::function(name, [obj, name](CallArgs& args) { return call_method(obj, name, args); });
  }

  // Jinja's getitem: entries and indices first, then attributes; otherwise undefined.
  Value item(const Value& obj, const Value& key) {
    require_defined(obj);
    if (obj.is_mapping() && key.is_string()) {
      if (const Value* v = obj.find(key.s())) return *v;
      return attribute(obj, key.s());
    }
    if ((obj.kind == Value::Kind::List || obj.is_string()) && integral(key)) {
      const int64_t n = obj.is_string() ? static_cast<int64_t>(utf8::length(obj.s())) : static_cast<int64_t>(obj.list->size());
      int64_t i = as_int(key);
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(type_name(obj) + " object has no element " + std::to_string(as_int(key)));
      if (obj.is_string()) return Value::from(pystr::slice(obj.s(), i, i + 1, 1));
      return (*obj.list)[static_cast<size_t>(i)];
    }
    if (key.is_string()) return attribute(obj, key.s());
    return Value::undefined(type_name(obj) + " object has no element " + repr(key));
  }

  Value slice(const Expr& e, Scope& scope) {
    const Value obj = eval(*e.items[0], scope);
    require_defined(obj);
    auto bound = [&](size_t k) { return e.items[k] ? slice_bound(eval(*e.items[k], scope)) : std::nullopt; };
    const auto start = bound(1), stop = bound(2), step = bound(3);
    if (obj.is_string()) return Value::from(pystr::slice(obj.s(), start, stop, step.value_or(1)));
    if (obj.kind != Value::Kind::List) throw type_error("'" + type_name(obj) + "' object is not subscriptable");
    List out;
    for (long i : pystr::slice_indices(static_cast<long>(obj.list->size()), start, stop, step.value_or(1)))
      out.push_back((*obj.list)[static_cast<size_t>(i)]);
    return Value::from(std::move(out), obj.is_tuple);
  }

  CallArgs arguments(const Expr& e, Scope& scope, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.items.size(); ++i) args.positional.push_back(eval(*e.items[i], scope));
    for (const auto& [k, v] : e.keywords) args.keyword.emplace_back(k, eval(*v, scope));
    return args;
  }

  Value call(const Expr& e, Scope& scope) {
    const Value callee = eval(*e.items[0], scope);
    require_defined(callee);
    if (callee.kind != Value::Kind::Callable) throw type_error("'" + type_name(callee) + "' object is not callable");
    CallArgs args = arguments(e, scope, 1);
    return callee.callable->fn(args);
  }

  Value unary(const std::string& op, const Value& v) {
    if (op == "not") return Value::from(!truthy(v));
    require_defined(v);
    if (!v.is_number()) throw type_error("bad operand type for unary " + op + ": '" + type_name(v) + "'");
    if (op == "+") return integral(v) ? Value::from(as_int(v)) : v;
    return integral(v) ? Value::from(-as_int(v)) : Value::from(-v.number);
  }

  int depth_ = 0;
};

}  // namespace

Template::Template(std::string_view source) : body_(parse(lex(source))) {}

std::string Template::render(const Dict& variables) const {
  Scope root;
  for (auto& [name, fn] : global_functions()) root.vars[name] = fn;
  for (const auto& [name, v] : variables) root.vars[name] = v;
  std::string out;
  Renderer().exec(body_, root, out);
  return out;
}

}  // namespace petrel::jinja
