#include "tokenizer/jinja_parser.h"

#include <set>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_error.h"

namespace petrel::jinja {
namespace {

// Tags of Jinja2 (and its extensions) that Petrel's engine does not implement.
const std::set<std::string> kUnsupportedTags = {
    "include", "import", "from", "extends", "block", "call", "filter", "with", "autoescape",
    "do", "trans", "pluralize", "endtrans", "debug", "recursive"};

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body document() {
    std::string end;
    Body body = statements({}, end);
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).type == Tok::Op && peek(ahead).text == op; }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == Tok::Name && peek(ahead).text == name;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::BlockEnd: return "end of tag '%}'";
      case Tok::VarEnd: return "end of '}}'";
      case Tok::End: return "end of template";
      case Tok::String: return "string '" + t.text + "'";
      default: return "'" + t.text + "'";
    }
  }

  void expect_op(const char* op) {
    if (!is_op(op)) fail(peek().line, std::string("expected '") + op + "', found " + describe(peek()));
    next();
  }
  void expect(Tok type, const char* what) {
    if (peek().type != type) fail(peek().line, std::string("expected ") + what + ", found " + describe(peek()));
    next();
  }
  std::string expect_name(const char* what) {
    if (peek().type != Tok::Name) fail(peek().line, std::string("expected ") + what + ", found " + describe(peek()));
    return next().text;
  }

  // Statements until a block tag named in `ends`; that tag's name is stored in `found`.
  Body statements(const std::set<std::string>& ends, std::string& found) {
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.type == Tok::End) {
        if (!ends.empty()) fail(tok.line, "unexpected end of template: missing '{% " + *ends.rbegin() + " %}'");
        return body;
      }
      if (tok.type == Tok::Text) {
        body.push_back(text_stmt(next()));
      } else if (tok.type == Tok::VarBegin) {
        body.push_back(print_stmt());
      } else if (tok.type == Tok::BlockBegin) {
        const Token& name = peek(1);
        if (name.type == Tok::Name && ends.count(name.text)) {
          next();
          found = next().text;
          return body;
        }
        body.push_back(block_stmt());
      } else {
        fail(tok.line, "unexpected " + describe(tok));
      }
    }
  }

  StmtPtr make(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  StmtPtr text_stmt(const Token& tok) {
    auto s = make(Stmt::Kind::Text, tok.line);
    s->text = tok.text;
    return s;
  }

  StmtPtr print_stmt() {
    auto s = make(Stmt::Kind::Print, next().line);
    s->expr = tuple_expr();
    expect(Tok::VarEnd, "'}}'");
    return s;
  }

  StmtPtr block_stmt() {
    next();  // {%
    const int line = peek().line;
    const std::string tag = expect_name("a tag name after '{%'");
    if (tag == "if") return if_stmt(line);
    if (tag == "for") return for_stmt(line);
    if (tag == "set") return set_stmt(line);
    if (tag == "macro") return macro_stmt(line);
    if (tag == "generation") return generation_stmt(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(line, "'{% " + tag + " %}' outside of a for loop");
      expect(Tok::BlockEnd, "'%}'");
      return make(tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, line);
    }
    if (kUnsupportedTags.count(tag)) fail(line, "unsupported template tag '" + tag + "'");
    fail(line, "unexpected tag '" + tag + "'");
  }

  StmtPtr if_stmt(int line) {
    auto s = make(Stmt::Kind::If, line);
    s->expr = expression();
    expect(Tok::BlockEnd, "'%}' after the if condition");
    std::string found;
    s->body = statements({"elif", "else", "endif"}, found);
    if (found == "elif") {
      s->else_body.push_back(if_stmt(peek().line));
      return s;
    }
    if (found == "else") {
      expect(Tok::BlockEnd, "'%}' after else");
      s->else_body = statements({"endif"}, found);
    }
    expect(Tok::BlockEnd, "'%}' after endif");
    return s;
  }

  StmtPtr for_stmt(int line) {
    auto s = make(Stmt::Kind::For, line);
    s->targets = target_names();
    if (!is_name("in")) fail(peek().line, "expected 'in' in for loop, found " + describe(peek()));
    next();
    s->expr = tuple_expr(/*with_condexpr=*/false);
    if (is_name("if")) {
      next();
      s->filter = expression();
    }
    if (is_name("recursive")) fail(peek().line, "unsupported for-loop option 'recursive'");
    expect(Tok::BlockEnd, "'%}' after the for loop header");
    std::string found;
    ++loop_depth_;
    s->body = statements({"else", "endfor"}, found);
    --loop_depth_;
    if (found == "else") {
      expect(Tok::BlockEnd, "'%}' after else");
      s->else_body = statements({"endfor"}, found);
    }
    expect(Tok::BlockEnd, "'%}' after endfor");
    return s;
  }

  std::vector<std::string> target_names() {
    std::vector<std::string> names{expect_name("a variable name")};
    while (is_op(",")) {
      next();
      names.push_back(expect_name("a variable name"));
    }
    return names;
  }

  StmtPtr set_stmt(int line) {
    if (peek().type == Tok::Name && is_op(".", 1)) {
      auto s = make(Stmt::Kind::SetAttr, line);
      s->targets = {next().text};
      next();
      s->text = expect_name("an attribute name");
      expect_op("=");
      s->expr = tuple_expr();
      expect(Tok::BlockEnd, "'%}'");
      return s;
    }
    auto targets = target_names();
    if (peek().type == Tok::BlockEnd && targets.size() == 1) {
      next();
      auto s = make(Stmt::Kind::SetBlock, line);
      s->targets = std::move(targets);
      std::string found;
      s->body = statements({"endset"}, found);
      expect(Tok::BlockEnd, "'%}' after endset");
      return s;
    }
    auto s = make(Stmt::Kind::Set, line);
    s->targets = std::move(targets);
    expect_op("=");
    s->expr = tuple_expr();
    expect(Tok::BlockEnd, "'%}'");
    return s;
  }

  StmtPtr macro_stmt(int line) {
    auto s = make(Stmt::Kind::Macro, line);
    s->text = expect_name("a macro name");
    expect_op("(");
    while (!is_op(")")) {
      const std::string param = expect_name("a macro parameter name");
      if (is_op("=")) {
        next();
        s->defaults.emplace_back(param, expression());
      } else if (!s->defaults.empty()) {
        fail(peek().line, "macro parameter '" + param + "' without a default follows one with a default");
      }
      s->targets.push_back(param);
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    expect(Tok::BlockEnd, "'%}' after the macro signature");
    std::string found;
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    s->body = statements({"endmacro"}, found);
    loop_depth_ = saved_depth;
    if (peek().type == Tok::Name) next();  // {% endmacro name %}
    expect(Tok::BlockEnd, "'%}' after endmacro");
    return s;
  }

  StmtPtr generation_stmt(int line) {
    auto s = make(Stmt::Kind::Generation, line);
    expect(Tok::BlockEnd, "'%}' after generation");
    std::string found;
    s->body = statements({"endgeneration"}, found);
    expect(Tok::BlockEnd, "'%}' after endgeneration");
    return s;
  }

  // ---- expressions, with Jinja2's precedence ----

  ExprPtr node(Expr::Kind kind, int line, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->name = std::move(name);
    return e;
  }

  ExprPtr binary(Expr::Kind kind, int line, std::string op, ExprPtr a, ExprPtr b) {
    auto e = node(kind, line, std::move(op));
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  // "a, b" without brackets is a tuple in print, set and for-loop positions.
  ExprPtr tuple_expr(bool with_condexpr = true) {
    const int line = peek().line;
    auto first = with_condexpr ? expression() : or_expr();
    if (!is_op(",")) return first;
    auto t = node(Expr::Kind::Tuple, line);
    t->items.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (peek().type == Tok::BlockEnd || peek().type == Tok::VarEnd || is_op(")")) break;
      t->items.push_back(with_condexpr ? expression() : or_expr());
    }
    return t;
  }

  ExprPtr expression() {
    auto e = or_expr();
    while (is_name("if")) {
      const int line = next().line;
      auto cond = node(Expr::Kind::Cond, line);
      auto test = or_expr();
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        otherwise = expression();
      }
      cond->items.push_back(std::move(e));
      cond->items.push_back(std::move(test));
      cond->items.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr or_expr() {
    auto e = and_expr();
    while (is_name("or")) {
      const int line = next().line;
      e = binary(Expr::Kind::Or, line, "or", std::move(e), and_expr());
    }
    return e;
  }

  ExprPtr and_expr() {
    auto e = not_expr();
    while (is_name("and")) {
      const int line = next().line;
      e = binary(Expr::Kind::And, line, "and", std::move(e), not_expr());
    }
    return e;
  }

  ExprPtr not_expr() {
    if (is_name("not")) {
      auto e = node(Expr::Kind::Unary, next().line, "not");
      e->items.push_back(not_expr());
      return e;
    }
    return compare_expr();
  }

  // Reads a comparison operator if one is next: ==, !=, <, <=, >, >=, in, not in.
  bool compare_op(std::string& op, bool& negated) {
    negated = false;
    if (peek().type == Tok::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                   peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
      op = next().text;
      return true;
    }
    if (is_name("in") || (is_name("not") && is_name("in", 1))) {
      negated = next().text == "not";
      if (negated) next();
      op = "in";
      return true;
    }
    return false;
  }

  // Chained comparisons (a < b < c) hold when every adjacent pair does, as in Python.
  ExprPtr compare_expr() {
    std::vector<ExprPtr> operands;
    operands.push_back(math1());
    std::vector<std::pair<std::string, bool>> ops;
    std::vector<int> lines;
    std::string op;
    bool negated = false;
    while (true) {
      const int line = peek().line;
      if (!compare_op(op, negated)) break;
      ops.emplace_back(op, negated);
      lines.push_back(line);
      operands.push_back(math1());
    }
    if (ops.empty()) return std::move(operands[0]);
    ExprPtr result;
    for (size_t k = 0; k < ops.size(); ++k) {
      ExprPtr rhs = k + 1 < ops.size() ? clone(*operands[k + 1]) : std::move(operands[k + 1]);
      auto cmp = binary(Expr::Kind::Binary, lines[k], ops[k].first, std::move(operands[k]), std::move(rhs));
      cmp->negated = ops[k].second;
      result = result ? binary(Expr::Kind::And, lines[k], "and", std::move(result), std::move(cmp)) : std::move(cmp);
    }
    return result;
  }

  // In a chain the middle operand belongs to two comparisons, so one of them gets a copy.
  ExprPtr clone(const Expr& src) {
    const Expr* e = &src;
    auto c = std::make_unique<Expr>();
    c->kind = e->kind;
    c->line = e->line;
    c->value = e->value;
    c->name = e->name;
    c->negated = e->negated;
    for (const auto& item : e->items) c->items.push_back(item ? clone(*item) : nullptr);
    for (const auto& [k, v] : e->keywords) c->keywords.emplace_back(k, clone(*v));
    return c;
  }

  ExprPtr math1() {
    auto e = concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.line, op.text, std::move(e), concat());
    }
    return e;
  }

  ExprPtr concat() {
    auto e = math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary(Expr::Kind::Binary, line, "~", std::move(e), math2());
    }
    return e;
  }

  ExprPtr math2() {
    auto e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.line, op.text, std::move(e), power());
    }
    return e;
  }

  ExprPtr power() {
    auto e = unary(true);
    while (is_op("**")) {
      const int line = next().line;
      e = binary(Expr::Kind::Binary, line, "**", std::move(e), unary(true));
    }
    return e;
  }

  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      e = node(Expr::Kind::Unary, op.line, op.text);
      e->items.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr literal(int line, Value v) {
    auto e = node(Expr::Kind::Literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr primary() {
    const Token& tok = next();
    switch (tok.type) {
      case Tok::Name:
        if (tok.text == "true" || tok.text == "True") return literal(tok.line, Value::from(true));
        if (tok.text == "false" || tok.text == "False") return literal(tok.line, Value::from(false));
        if (tok.text == "none" || tok.text == "None") return literal(tok.line, Value::none());
        return node(Expr::Kind::Name, tok.line, tok.text);
      case Tok::String: {
        std::string s = tok.text;
        while (peek().type == Tok::String) s += next().text;  // adjacent literals concatenate
        return literal(tok.line, Value::from(std::move(s)));
      }
      case Tok::Int: return literal(tok.line, Value::from(tok.integer));
      case Tok::Float: return literal(tok.line, Value::from(tok.number));
      case Tok::Op:
        if (tok.text == "(") return parenthesized(tok.line);
        if (tok.text == "[") return list_literal(tok.line);
        if (tok.text == "{") return dict_literal(tok.line);
        break;
      default:
        break;
    }
    fail(tok.line, "unexpected " + describe(tok) + " in expression");
  }

  ExprPtr parenthesized(int line) {
    if (is_op(")")) {
      next();
      return node(Expr::Kind::Tuple, line);
    }
    auto e = expression();
    if (is_op(",")) {
      auto t = node(Expr::Kind::Tuple, line);
      t->items.push_back(std::move(e));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        t->items.push_back(expression());
      }
      e = std::move(t);
    }
    expect_op(")");
    return e;
  }

  ExprPtr list_literal(int line) {
    auto e = node(Expr::Kind::List, line);
    while (!is_op("]")) {
      e->items.push_back(expression());
      if (!is_op(",")) break;
      next();
    }
    expect_op("]");
    return e;
  }

  ExprPtr dict_literal(int line) {
    auto e = node(Expr::Kind::Dict, line);
    while (!is_op("}")) {
      e->items.push_back(expression());
      expect_op(":");
      e->items.push_back(expression());
      if (!is_op(",")) break;
      next();
    }
    expect_op("}");
    return e;
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (peek().type == Tok::Int) {  // x.0 is x[0] in Jinja
          auto item = node(Expr::Kind::Item, line);
          item->items.push_back(std::move(e));
          item->items.push_back(literal(line, Value::from(next().integer)));
          e = std::move(item);
          continue;
        }
        auto attr = node(Expr::Kind::Attr, line, expect_name("an attribute name after '.'"));
        attr->items.push_back(std::move(e));
        e = std::move(attr);
      } else if (is_op("[")) {
        e = subscript(std::move(e), next().line);
      } else if (is_op("(")) {
        e = call(std::move(e), next().line);
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        is_slice = true;
        if (++part > 2) fail(line, "too many ':' in slice");
        continue;
      }
      if (parts[part]) fail(peek().line, "expected ':' or ']' in subscript, found " + describe(peek()));
      parts[part] = expression();
    }
    expect_op("]");
    auto e = node(is_slice ? Expr::Kind::Slice : Expr::Kind::Item, line);
    e->items.push_back(std::move(target));
    if (!is_slice && !parts[0]) fail(line, "empty subscript '[]'");
    for (int k = 0; k < (is_slice ? 3 : 1); ++k) e->items.push_back(std::move(parts[k]));
    return e;
  }

  // Arguments after '(' (already consumed) up to and including ')'.
  void arguments(Expr& e) {
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail(peek().line, "unsupported argument unpacking with '*' / '**'");
      if (peek().type == Tok::Name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.keywords.emplace_back(std::move(key), expression());
      } else {
        if (!e.keywords.empty()) fail(peek().line, "positional argument follows keyword argument");
        e.items.push_back(expression());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprPtr call(ExprPtr callee, int line) {
    auto e = node(Expr::Kind::Call, line);
    e->items.push_back(std::move(callee));
    arguments(*e);
    return e;
  }

  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        const std::string name = expect_name("a filter name after '|'");
        if (!is_filter(name)) fail(line, "unsupported filter '" + name + "'");
        auto f = node(Expr::Kind::Filter, line, name);
        f->items.push_back(std::move(e));
        if (is_op("(")) {
          next();
          arguments(*f);
        }
        e = std::move(f);
      } else if (is_name("is")) {
        e = test(std::move(e), next().line);
      } else if (is_op("(")) {
        e = call(std::move(e), next().line);
      } else {
        return e;
      }
    }
  }

  ExprPtr test(ExprPtr subject, int line) {
    bool negated = false;
    if (is_name("not")) {
      next();
      negated = true;
    }
    const std::string name = expect_name("a test name after 'is'");
    if (!is_test(name)) fail(line, "unsupported test '" + name + "'");
    auto t = node(Expr::Kind::Test, line, name);
    t->negated = negated;
    t->items.push_back(std::move(subject));
    const Token& arg = peek();
    const bool bare_argument =
        (arg.type == Tok::Name || arg.type == Tok::String || arg.type == Tok::Int || arg.type == Tok::Float ||
         is_op("[") || is_op("{")) &&
        !is_name("else") && !is_name("or") && !is_name("and");
    if (is_op("(")) {
      next();
      arguments(*t);
    } else if (bare_argument) {
      t->items.push_back(postfix(primary()));
    }
    return t;
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).document(); }

}  // namespace petrel::jinja
