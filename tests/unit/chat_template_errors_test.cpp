// Unsupported template constructs and template runtime errors name the construct and the line.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_template.h"

namespace petrel {
namespace {

std::string render(const std::string& source, const jinja::Dict& vars = {}) {
  return jinja::Template(source).render(vars);
}

// Parsing or rendering `source` fails with a message containing each of `needles`.
void expect_error(const std::string& source, std::initializer_list<std::string> needles) {
  try {
    const std::string out = render(source);
    ADD_FAILURE() << "no error for " << source << "; rendered: " << out;
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << source << " -> " << e.what();
  }
}

TEST(ChatTemplateErrors, UnsupportedConstructsNameTheConstructAndLine) {
  expect_error("a\n{% include 'other.jinja' %}", {"line 2", "unsupported template tag 'include'"});
  expect_error("{% extends 'base' %}", {"line 1", "'extends'"});
  expect_error("x\ny\n{{ name | frobnicate }}", {"line 3", "unsupported filter 'frobnicate'"});
  expect_error("{% if x is frobbed %}{% endif %}", {"line 1", "unsupported test 'frobbed'"});
  expect_error("{% for x in y recursive %}{% endfor %}", {"'recursive'"});
  expect_error("{% call m() %}{% endcall %}", {"'call'"});
  expect_error("{{ f(*args) }}", {"unpacking"});
  expect_error("{{ '%s' % 'x' }}", {"'%'"});
  expect_error("{{ {1: 2} }}", {"dict literal key"});
  expect_error("{{ 'abc'.format(1) }}", {"unsupported str method or attribute 'format'"});
}

TEST(ChatTemplateErrors, SyntaxErrorsNameTheLine) {
  expect_error("{% if x %}\nunclosed", {"missing '{% endif %}'"});
  expect_error("\n\n{% break %}", {"line 3", "outside of a for loop"});
  expect_error("{{ 'unterminated }}", {"unterminated string"});
  expect_error("{{ x ", {"unclosed '{{'"});
  expect_error("{# never closed", {"unclosed comment"});
  expect_error("{% endfor %}", {"unexpected tag 'endfor'"});
  expect_error("{{ 1 + }}", {"unexpected"});
}

TEST(ChatTemplateErrors, RuntimeErrorsNameTheLine) {
  expect_error("ok\n{{ missing.attribute }}", {"line 2", "'missing' is undefined"});
  expect_error("{{ raise_exception('Only user and assistant roles are supported.') }}",
               {"raised", "Only user and assistant roles are supported."});
  expect_error("{% for x in 5 %}{% endfor %}", {"not iterable"});
  expect_error("{{ 'a' + 1 }}", {"unsupported operand type(s) for +: 'str' and 'int'"});
  expect_error("{{ 1 // 0 }}", {"ZeroDivisionError"});
  expect_error("{% set x = 1 %}{% set x.y = 2 %}", {"namespace"});
  expect_error("{{ 5 | items }}", {"Can only get item pairs from a mapping."});
  expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {"macro 'm' takes not more than 1 argument(s)"});
}

TEST(ChatTemplateErrors, EmptyConversationIsRejected) {
  const ChatTemplate tmpl({{"default", "{{ messages }}"}}, nlohmann::ordered_json::object());
  EXPECT_THROW(tmpl.apply(ChatRequest{}), Error);
}

TEST(ChatTemplateEngine, NamedTemplatesFollowHuggingFaceChoice) {
  const ChatTemplate tmpl({{"default", "D"}, {"tool_use", "T"}}, nlohmann::ordered_json::object());
  ChatRequest req;
  req.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(tmpl.apply(req), "D");
  req.tools = nlohmann::ordered_json::array();
  EXPECT_EQ(tmpl.apply(req), "T");
}

TEST(ChatTemplateEngine, KwargsAndSpecialTokensAreVariables) {
  const ChatTemplate tmpl({{"default", "{{ bos_token }}{{ messages[0].content }}{% if enable_thinking is false %}!{% endif %}"}},
                          {{"bos_token", "<s>"}});
  ChatRequest req;
  req.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(tmpl.apply(req), "<s>hi");
  req.kwargs["enable_thinking"] = false;
  EXPECT_EQ(tmpl.apply(req), "<s>hi!");
}

// A template argument must not replace what the render sets: the validated messages, the
// generation prompt switch, the special tokens, the engine's functions.
TEST(ChatTemplateEngine, KwargsCannotReplaceTheVariablesTheRenderSets) {
  for (const char* name : {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
                           "additional_special_tokens", "raise_exception", "range", "namespace", "strftime_now"})
    EXPECT_TRUE(ChatTemplate::sets_variable(name)) << name;
  for (const char* name : {"enable_thinking", "add_vision_id", "message", "tool"}) EXPECT_FALSE(ChatTemplate::sets_variable(name)) << name;
  const ChatTemplate tmpl({{"default", "{% for m in messages %}{{ m.role }}{% endfor %}"}}, nlohmann::ordered_json::object());
  ChatRequest req;
  req.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  req.kwargs["messages"] = nlohmann::ordered_json::array({{{"role", "evil"}, {"content", "x"}}});
  try {
    tmpl.apply(req);
    ADD_FAILURE() << "kwargs replaced messages";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'messages'"), std::string::npos) << e.what();
  }
}

// Values are walked recursively; nesting past 256 levels is refused before it can overflow the stack.
TEST(ChatTemplateEngine, DeeplyNestedValuesAreRefused) {
  const auto nested = [](int depth) {
    nlohmann::ordered_json v = 1;
    for (int i = 0; i < depth; ++i) v = nlohmann::ordered_json::array({std::move(v)});
    return v;
  };
  EXPECT_NO_THROW(jinja::Value::from_json(nested(255)));
  EXPECT_THROW(jinja::Value::from_json(nested(256)), std::invalid_argument);
  EXPECT_THROW(jinja::Value::from_json(nested(20000)), std::invalid_argument);
}

}  // namespace
}  // namespace petrel
