// Chat templates render byte-identically to transformers' apply_chat_template, and the small
// feature templates to Jinja2 under Hugging Face's settings (goldens from tools/tokenizer).
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_template.h"
#include "tokenizer_test_util.h"

namespace petrel {
namespace {

using nlohmann::ordered_json;

ChatRequest request_of(const ordered_json& conv) {
  ChatRequest r;
  r.messages = conv["messages"];
  if (conv.contains("tools")) r.tools = conv["tools"];
  r.add_generation_prompt = conv["add_generation_prompt"].get<bool>();
  if (conv.contains("kwargs")) r.kwargs = conv["kwargs"];
  return r;
}

// A reference error from raise_exception() carries the template's message, which ours must
// repeat; other reference errors (type errors, undefined values) only require that we fail too.
void expect_outcome(const std::function<std::string()>& render, const ordered_json& want, const std::string& label) {
  if (want.contains("text")) {
    try {
      EXPECT_EQ(render(), want["text"].get<std::string>()) << label;
    } catch (const std::exception& e) {
      ADD_FAILURE() << label << ": unexpected error: " << e.what();
    }
    return;
  }
  const std::string error = want["error"];
  try {
    const std::string got = render();
    ADD_FAILURE() << label << ": expected an error like \"" << error << "\", rendered:\n" << got;
  } catch (const Error& e) {
    const std::string prefix = "TemplateError: ";
    if (error.rfind(prefix, 0) == 0)
      EXPECT_NE(std::string(e.what()).find(error.substr(prefix.size())), std::string::npos)
          << label << ": got \"" << e.what() << "\"";
  }
}

void expect_conversations(const ChatTemplate& tmpl, const std::string& name) {
  const auto conversations = test::read_json(test::tokenizer_fixtures() / "conversations.json");
  const auto goldens = test::read_json(test::tokenizer_fixtures() / "render_goldens.json");
  for (const auto& conv : conversations) {
    const std::string key = name + "/" + conv["name"].get<std::string>();
    ASSERT_TRUE(goldens.contains(key)) << "no golden for " << key;
    const ChatRequest req = request_of(conv);
    expect_outcome([&] { return tmpl.apply(req); }, goldens[key], key);
  }
}

TEST(ChatTemplateGolden, Qwen3ConversationsMatchTransformers) {
  PETREL_REQUIRE_QWEN3();
  expect_conversations(ChatTemplate::load(test::qwen3_dir()), "qwen3");
}

TEST(ChatTemplateGolden, Qwen35ConversationsMatchTransformers) {
  PETREL_REQUIRE_QWEN3();
  // The goldens applied the Qwen3.5 template through the Qwen3 tokenizer (same special tokens).
  const auto config = test::read_json(test::qwen3_dir() / "tokenizer_config.json");
  ordered_json specials = {{"eos_token", config["eos_token"]}, {"pad_token", config["pad_token"]},
                           {"additional_special_tokens", config["additional_special_tokens"]}};
  const ChatTemplate tmpl({{"default", test::read_file(test::tokenizer_fixtures() / "qwen3_5_chat_template.jinja")}},
                          specials);
  expect_conversations(tmpl, "qwen3_5");
}

TEST(ChatTemplateGolden, FeatureTemplatesMatchJinja2) {
  const auto features = test::read_json(test::tokenizer_fixtures() / "jinja_features.json");
  const auto goldens = test::read_json(test::tokenizer_fixtures() / "jinja_feature_goldens.json");
  jinja::Dict vars;
  for (const auto& [k, v] : features["vars"].items()) vars.emplace_back(k, jinja::Value::from_json(v));
  for (const auto& [name, source] : features["templates"].items()) {
    ASSERT_TRUE(goldens.contains(name)) << "no golden for " << name;
    expect_outcome([&] { return jinja::Template(source.get<std::string>()).render(vars); }, goldens[name], name);
  }
}

}  // namespace
}  // namespace petrel
