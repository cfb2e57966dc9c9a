// Conversations on petrel-tiny: later turns reuse the sequence state (the live one, or the
// checkpoint at the end of the last user message) and answer exactly as a fresh prefill of the
// whole conversation would; the history, system message, thinking switch and context guard.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "generate/conversation.h"
#include "generate/host_decoder.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel {
namespace {

namespace fs = std::filesystem;

std::string tiny_dir() {
  return (fs::path(PETREL_FIXTURES_DIR) / ".." / ".." / "models" / "petrel-tiny").lexically_normal().string();
}

class TinyConversation : public ::testing::Test {
 protected:
  void SetUp() override {
    ck_ = Checkpoint::open(tiny_dir());
    model_ = std::make_unique<Model>(ck_->config(), ck_->weights(), backend_);
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(tiny_dir()));
    template_ = std::make_unique<ChatTemplate>(ChatTemplate::load(tiny_dir()));
    decoder_ = std::make_unique<HostDecoder>(*model_);
  }

  ConversationOptions options(int capacity = 2048) const {
    ConversationOptions o;
    o.multi_turn = true;
    o.capacity = capacity;
    o.sampling.temperature = 0.0f;
    o.eos_ids = {2};  // <|im_end|>
    o.max_tokens = 64;
    return o;
  }

  // The answer a fresh state gives to the whole prompt, for comparison with reused states.
  std::vector<int32_t> fresh_answer(const std::vector<int32_t>& prompt) {
    HostDecoder decoder(*model_);
    Generator generator(decoder);
    auto st = model_->new_sequence(2048);
    GenerateRequest req;
    req.tokens = prompt;
    req.sampling.temperature = 0.0f;
    req.eos_ids = {2};
    req.max_tokens = 64;
    return generator.generate(st, req, [](int32_t) { return true; }).tokens;
  }

  struct Asked {
    int prompt_tokens, prefilled, answer_tokens;
  };

  // Asks each question, checking the answer against a fresh prefill of the whole prompt.
  std::vector<Asked> converse(Conversation& c, const std::vector<std::string>& questions,
                              const std::vector<std::string>& answers) {
    std::vector<Asked> out;
    for (size_t i = 0; i < questions.size(); ++i) {
      const std::vector<int32_t> prompt = c.prompt_for(questions[i]);
      const Turn t = c.ask(questions[i], [](Channel, std::string_view) {});
      EXPECT_EQ(t.result.tokens, fresh_answer(prompt)) << "turn " << i;
      EXPECT_EQ(t.text, answers[i]);
      EXPECT_EQ(t.result.stats.prompt_tokens, int(prompt.size()));
      out.push_back({int(prompt.size()), t.result.stats.prefilled, int(t.result.tokens.size())});
    }
    return out;
  }

  std::string text_of(const std::vector<int32_t>& ids) const {
    return tokenizer_->decode(std::vector<uint32_t>(ids.begin(), ids.end()));
  }

  std::unique_ptr<Checkpoint> ck_;
  CpuBackend backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
  std::unique_ptr<HostDecoder> decoder_;
};

const std::vector<std::string> kQuestions = {"What is 2 + 3?", "Reverse the word petrel.", "What is 48213 + 9377?"};
const std::vector<std::string> kAnswers = {"Digits from the right: 5\nAnswer: 5", "lertep",
                                           "Digits from the right: 09575\nAnswer: 57590"};

TEST_F(TinyConversation, LaterTurnsReuseTheLiveStateAndAnswerAsAFreshPrefill) {
  Conversation c(*decoder_, *tokenizer_, template_.get(), options());
  const std::vector<Asked> a = converse(c, kQuestions, kAnswers);
  EXPECT_EQ(c.history_size(), 6u);
  EXPECT_EQ(a[0].prefilled, a[0].prompt_tokens);
  // The state holds the previous prompt and answer (all but the unfed <|im_end|>): only the
  // rest is prefilled.
  for (size_t i = 1; i < a.size(); ++i)
    EXPECT_EQ(a[i].prefilled, a[i].prompt_tokens - (a[i - 1].prompt_tokens + a[i - 1].answer_tokens - 1)) << i;
}

// A template that renders earlier answers differently from how they were generated (as Qwen3
// drops their reasoning): the live state no longer matches, the checkpoint at the end of the
// previous user message does.
TEST_F(TinyConversation, TemplatesThatRerenderEarlierAnswersUseTheCheckpoint) {
  const ChatTemplate shortening(
      {{"default",
        "{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + message.content[-2:] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"}},
      nlohmann::ordered_json::object());
  Conversation c(*decoder_, *tokenizer_, &shortening, options());
  const std::vector<Asked> a = converse(c, kQuestions, kAnswers);
  const int generation_prompt = 3;  // <|im_start|> assistant \n
  for (size_t i = 1; i < a.size(); ++i)
    EXPECT_EQ(a[i].prefilled, a[i].prompt_tokens - (a[i - 1].prompt_tokens - generation_prompt)) << i;
}

TEST_F(TinyConversation, ResetForgetsTheHistoryAndTheSystemMessageGoesFirst) {
  Conversation c(*decoder_, *tokenizer_, template_.get(), options());
  c.ask("What is 2 + 3?", [](Channel, std::string_view) {});
  EXPECT_EQ(c.history_size(), 2u);
  c.reset();
  EXPECT_EQ(c.history_size(), 0u);
  c.set_system("Be brief.");
  EXPECT_EQ(text_of(c.prompt_for("Hi")),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<Asked> a = converse(c, {kQuestions[1]}, {kAnswers[1]});
  EXPECT_EQ(a[0].prefilled, a[0].prompt_tokens) << "nothing of the old conversation can be reused";
}

TEST_F(TinyConversation, OutgrowingTheContextIsAnErrorThatKeepsTheHistory) {
  Conversation c(*decoder_, *tokenizer_, template_.get(), options(60));
  c.ask("What is 2 + 3?", [](Channel, std::string_view) {});
  ASSERT_EQ(c.history_size(), 2u);
  try {
    c.ask("What is 48213 + 9377? And what is 99999 + 1 after that?", [](Channel, std::string_view) {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the conversation is"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the context holds at most 60"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.history_size(), 2u);
  converse(c, {kQuestions[1]}, {kAnswers[1]});  // and the conversation goes on
}

TEST_F(TinyConversation, ThinkingSwitchReachesTheTemplate) {
  std::ifstream in(fs::path(PETREL_FIXTURES_DIR) / "tokenizer" / "qwen3_5_chat_template.jinja");
  const std::string source((std::istreambuf_iterator<char>(in)), {});
  const ChatTemplate qwen35({{"default", source}}, nlohmann::ordered_json::object());
  Conversation c(*decoder_, *tokenizer_, &qwen35, options());
  const std::string on = text_of(c.prompt_for("Hi"));
  EXPECT_EQ(on.substr(on.size() - 30), "<|im_start|>assistant\n<think>\n") << on;
  c.set_thinking(false);
  const std::string off = text_of(c.prompt_for("Hi"));
  EXPECT_EQ(off.substr(off.size() - 41), "<|im_start|>assistant\n<think>\n\n</think>\n\n") << off;
}

}  // namespace
}  // namespace petrel
