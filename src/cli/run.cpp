// `petrel run DIR -p "prompt"`: one answer, streamed as it is generated. The prompt may also come
// from a file or stdin, go in raw (no chat template), or be token ids (--prompt-ids; with
// --output-ids the generated ids are printed space separated on one line). --json-schema FILE holds
// the answer to a JSON schema.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>

#include "cli/answer_printer.h"
#include "cli/common.h"
#include "cli/generation_flags.h"
#include "cli/interrupt.h"
#include "cli/json_schema_flag.h"
#include "cli/registry.h"
#include "core/error.h"
#include "generate/make_decoder.h"
#include "io/model_tokenizer.h"

namespace petrel::cli {
namespace {

struct Args {
  std::string dir, prompt, file, ids, json_schema;
  bool raw = false, output_ids = false;
  GenerationFlags gen;
  LoadOptions load;
};

std::string read_all(std::istream& in) { return std::string(std::istreambuf_iterator<char>(in), {}); }

// -p, -f FILE (- for stdin), or stdin when it is not a terminal.
std::string prompt_text(const Args& a) {
  if (!a.prompt.empty()) return a.prompt;
  if (a.file == "-" || (a.file.empty() && !isatty(STDIN_FILENO))) return read_all(std::cin);
  check(!a.file.empty(), "no prompt: give -p TEXT, -f FILE, --prompt-ids IDS, or pipe the prompt on stdin");
  std::ifstream in(a.file, std::ios::binary);
  check(bool(in), "-f: cannot open " + a.file);
  return read_all(in);
}

// The sequence must hold the prompt and the answer; without --context, just enough for
// --max-tokens, else the model's trained length.
int context_for(const ModelConfig& c, const GenerationFlags& f, const ConversationOptions& o, int prompt_tokens) {
  const std::string limit = c.max_position > 0 ? " (the model's limit is " + std::to_string(c.max_position) + ")" : "";
  int capacity = f.context;
  if (capacity == 0 && o.max_tokens > 0) capacity = prompt_tokens + o.max_tokens;
  if (c.max_position > 0 && (capacity == 0 || (f.context == 0 && capacity > c.max_position))) capacity = c.max_position;
  check(capacity > 0, "the model's config gives no context length: set --context");
  check(prompt_tokens < capacity, "the prompt is " + std::to_string(prompt_tokens) + " tokens but the context holds " +
                                      std::to_string(capacity) + limit + "; --context sets it");
  if (c.max_position > 0 && capacity > c.max_position)
    std::fprintf(stderr, "warning: --context %d exceeds the model's trained length %d\n", capacity, c.max_position);
  return capacity;
}

void print_setup(const LoadedModel& m, const ConversationOptions& o) {
  std::fprintf(stderr, "%s\n", m.summary().c_str());
  std::string line = "sampling " + describe_sampling(o.sampling) + ", context " + std::to_string(o.capacity);
  if (o.speculative.draft > 0) line += ", " + describe_speculative(o.speculative);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void run_text(const CLI::App& cmd, const Args& a, LoadedModel& m) {
  std::string text = prompt_text(a);
  // A file or piped line ends in a newline that is no part of the message.
  if (!a.raw && a.prompt.empty() && !text.empty() && text.back() == '\n') text.pop_back();
  const Tokenizer tokenizer = load_tokenizer(a.dir);
  std::optional<ChatTemplate> chat_template;
  if (!a.raw) {
    try {
      chat_template.emplace(load_chat_template(a.dir));
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + "; --raw runs the prompt without a chat template");
    }
  }
  ConversationOptions o = resolve_generation(cmd, a.gen, a.dir, m.config(), &tokenizer);
  o.grammar = schema_grammar(a.json_schema, tokenizer, m.config().vocab);
  const std::unique_ptr<Decoder> decoder = make_decoder(*m.model);
  const ChatTemplate* tmpl = chat_template ? &*chat_template : nullptr;
  o.capacity = 1;
  const int prompt_tokens = int(Conversation(*decoder, tokenizer, tmpl, o).prompt_for(text).size());
  o.capacity = context_for(m.config(), a.gen, o, prompt_tokens);
  print_setup(m, o);
  Conversation conversation(*decoder, tokenizer, tmpl, o);
  AnswerPrinter printer(a.gen.show_thinking);
  Interrupt interrupt(/*repeat_kills=*/true);
  const Turn turn =
      conversation.ask(text, [&](Channel c, std::string_view s) { printer.show(c, s); }, interrupt.flag());
  printer.finish(turn.result, o.speculative.draft > 0);
}

void run_ids(const CLI::App& cmd, const Args& a, LoadedModel& m) {
  check(a.prompt.empty() && a.file.empty(), "--prompt-ids cannot be combined with -p or -f");
  const std::vector<int32_t> prompt = parse_ids(a.ids, "--prompt-ids");
  std::optional<Tokenizer> tokenizer;
  if (has_tokenizer(a.dir)) tokenizer.emplace(load_tokenizer(a.dir));
  check(tokenizer || a.gen.stops.empty(),
        "--stop needs the checkpoint's tokenizer (tokenizer.json, or a GGUF file's vocabulary), which " + a.dir + " lacks");
  check(tokenizer || a.json_schema.empty(),
        "--json-schema needs the checkpoint's tokenizer (tokenizer.json, or a GGUF file's vocabulary), which " + a.dir +
            " lacks");
  ConversationOptions o = resolve_generation(cmd, a.gen, a.dir, m.config(), tokenizer ? &*tokenizer : nullptr);
  if (tokenizer) o.grammar = schema_grammar(a.json_schema, *tokenizer, m.config().vocab);
  o.capacity = context_for(m.config(), a.gen, o, int(prompt.size()));
  print_setup(m, o);

  const std::unique_ptr<Decoder> decoder = make_decoder(*m.model);
  Generator generator(*decoder);
  auto st = m.model->new_sequence(o.capacity);
  AnswerPrinter printer(a.gen.show_thinking);
  std::optional<TextOutput> text;
  const bool show_text = tokenizer && !a.output_ids;
  if (tokenizer)
    text.emplace(*tokenizer, ThinkFilter(), o.stops, [&](Channel c, std::string_view s) {
      if (show_text) printer.show(c, s);
    });
  Interrupt interrupt(/*repeat_kills=*/true);
  GenerateRequest req = make_request(o, prompt);
  req.cancel = interrupt.flag();
  const GenerateResult r = generator.generate(st, req, [&](int32_t id) {
    if (!show_text && !a.output_ids) std::printf("%d ", id);
    return text ? text->push(id) : true;
  });
  if (text) text->finish();
  if (a.output_ids) {
    std::string line;
    for (size_t i = 0; i < r.tokens.size(); ++i) line += (i ? " " : "") + std::to_string(r.tokens[i]);
    std::printf("%s\n", line.c_str());
  }
  printer.finish(r, o.speculative.draft > 0);
}

void run(const CLI::App& cmd, Args& a) {
  a.load.progress = isatty(STDERR_FILENO);
  LoadedModel m = load_model(a.dir, a.load);
  if (!a.ids.empty()) run_ids(cmd, a, m);
  else run_text(cmd, a, m);
}

void add(CLI::App& app) {
  static Args a;
  auto* cmd = app.add_subcommand("run", "Answer one prompt, streaming the answer");
  add_model_dir(cmd, a.dir, "Checkpoint folder");
  cmd->add_option("-p,--prompt", a.prompt, "The prompt (chat template applied unless --raw)");
  cmd->add_option("-f,--file", a.file, "Read the prompt from a file (- for stdin)");
  cmd->add_option("--prompt-ids", a.ids, "Prompt token ids, comma separated (no template)");
  cmd->add_flag("--raw", a.raw, "Feed the prompt as is, without the chat template");
  cmd->add_flag("--output-ids", a.output_ids, "Print the generated token ids, space separated, on one line");
  cmd->add_option("--json-schema", a.json_schema, "Hold the answer to the JSON schema in FILE (structured output)");
  add_generation_flags(cmd, a.gen);
  add_load_flags(cmd, a.load);
  cmd->callback([cmd] { run(*cmd, a); });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
