// Syntax tree of a parsed template: expressions and statements, each with its source line.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace petrel::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,   // value
    Name,      // name
    List,      // items
    Tuple,     // items
    Dict,      // items: key, value, key, value, ...
    Attr,      // items[0].name
    Item,      // items[0][items[1]]
    Slice,     // items[0][items[1]:items[2]:items[3]] (null parts omitted)
    Call,      // items[0](items[1..], keywords)
    Filter,    // items[0] | name(items[1..], keywords)
    Test,      // items[0] is [not] name(items[1..], keywords)
    Unary,     // name items[0]: "not", "-", "+"
    Binary,    // items[0] name items[1]: arithmetic, comparison, "in", "~"
    And,       // items[0] and items[1]
    Or,        // items[0] or items[1]
    Cond,      // items[0] if items[1] else items[2] (items[2] may be null)
  };
  Kind kind;
  int line;
  Value value;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  bool negated = false;  // "is not", "not in"
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,        // text
    Print,       // {{ expr }}
    If,          // if expr: body else else_body (elif is a nested If in else_body)
    For,         // for targets in expr [if filter]: body else else_body
    Set,         // set targets = expr
    SetAttr,     // set targets[0].attr = expr (namespace attribute)
    SetBlock,    // set targets[0]: body
    Macro,       // macro name(targets, defaults): body
    Break,
    Continue,
    Generation,  // Hugging Face's {% generation %}: renders its body
  };
  Kind kind;
  int line;
  std::string text;  // Text content, macro name, or namespace attribute
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::vector<std::pair<std::string, ExprPtr>> defaults;  // macro parameters with defaults
  Body body, else_body;
};

}  // namespace petrel::jinja
