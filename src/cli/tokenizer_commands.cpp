// `petrel tokenize`, `petrel detokenize` and `petrel template`: the tokenizer and chat template
// of a checkpoint folder, on their own.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/common.h"
#include "cli/number_flags.h"
#include "cli/registry.h"
#include "core/error.h"
#include "io/gguf.h"
#include "io/model_folder.h"
#include "io/model_tokenizer.h"
#include "petrel/tokenizer.h"
#include "tokenizer/chat_template.h"

namespace petrel::cli {
namespace {

using nlohmann::ordered_json;

// The file's contents; "-" reads stdin.
std::string read_file(const std::string& path, const std::string& flag) {
  std::ostringstream s;
  if (path == "-") {
    s << std::cin.rdbuf();
    return s.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(flag + ": cannot open " + path);
  s << in.rdbuf();
  return s.str();
}

ordered_json read_json_file(const std::string& path, const std::string& flag) {
  try {
    return ordered_json::parse(read_file(path, flag));
  } catch (const ordered_json::exception& e) {
    throw Error(flag + ": " + path + " is not valid JSON: " + e.what());
  }
}

// A GGUF file carries its tokenizer; a folder must hold tokenizer.json.
Tokenizer tokenizer_of(const std::string& model) {
  if (!is_gguf_file(model)) check_model_folder(model, "tokenizer.json", "a folder containing tokenizer.json");
  return load_tokenizer(model);
}

struct TokenizeArgs {
  std::string dir, text, file;
  bool bench = false, json = false;
  int runs = 5;
};

// Encodes `text` `runs` times from a cold word cache and reports the median throughput.
void bench(const Tokenizer& tok, const std::string& text, int runs) {
  std::vector<double> cold, warm;
  size_t n_ids = 0;
  for (int r = 0; r < runs; ++r) {
    tok.clear_cache();
    for (auto* times : {&cold, &warm}) {
      const auto t0 = std::chrono::steady_clock::now();
      n_ids = tok.encode(text).size();
      times->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  auto median_mbs = [&](std::vector<double>& t) {
    std::sort(t.begin(), t.end());
    return text.size() / 1e6 / t[t.size() / 2];
  };
  std::printf("input            %zu bytes, %zu tokens (%.2f bytes/token)\n", text.size(), n_ids,
              n_ids ? double(text.size()) / n_ids : 0.0);
  std::printf("encode, cold     %.2f MB/s (median of %d runs, one thread, word cache cleared)\n", median_mbs(cold), runs);
  std::printf("encode, warm     %.2f MB/s (same text again, word cache filled)\n", median_mbs(warm));
}

// The ids comma separated on one line (what detokenize --ids reads), or as a JSON array; an
// empty text has none: an empty line, or [].
void run_tokenize(const CLI::App& cmd, const TokenizeArgs& a) {
  check(cmd.count("--text") + cmd.count("--file") == 1, "tokenize: give exactly one of --text and --file");
  const std::string text = cmd.count("--file") ? read_file(a.file, "--file") : a.text;
  const Tokenizer tok = tokenizer_of(a.dir);
  if (a.bench) {
    check(!text.empty(), "tokenize --bench: the text is empty (nothing to measure)");
    bench(tok, text, a.runs);
    return;
  }
  const auto ids = tok.encode(text);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? (a.json ? ", " : ",") : "") + std::to_string(ids[i]);
  std::printf(a.json ? "[%s]\n" : "%s\n", line.c_str());
}

void add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text (as Hugging Face tokenizers would)");
  static TokenizeArgs a;
  add_model_dir(cmd, a.dir, "Folder with tokenizer.json, or a .gguf file");
  cmd->add_option("--text", a.text, "Text to encode");
  cmd->add_option("--file", a.file, "File whose contents to encode (UTF-8; - for stdin)");
  cmd->add_flag("--json", a.json, "Print the ids as a JSON array, [] for an empty text");
  cmd->add_flag("--bench", a.bench, "Measure encode throughput on the text instead of printing ids");
  cmd->add_option("--runs", a.runs, "Benchmark repetitions (median reported)")->check(integer_in(1));
  cmd->callback([cmd] { run_tokenize(*cmd, a); });
}

struct DetokenizeArgs {
  std::string dir, ids;
  bool skip_special = false;
};

void run_detokenize(const DetokenizeArgs& a) {
  const Tokenizer tok = tokenizer_of(a.dir);
  std::vector<uint32_t> ids;
  for (int32_t id : parse_ids(a.ids, "--ids")) ids.push_back(static_cast<uint32_t>(id));
  const std::string text = tok.decode(ids, a.skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::printf("\n");
}

void add_detokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("detokenize", "Print the text of token ids");
  static DetokenizeArgs a;
  add_model_dir(cmd, a.dir, "Folder with tokenizer.json, or a .gguf file");
  cmd->add_option("--ids", a.ids, "Token ids, e.g. 9707,11,1879")->required();
  cmd->add_flag("--skip-special", a.skip_special, "Leave out special tokens such as <|im_end|>");
  cmd->callback([] { run_detokenize(a); });
}

struct TemplateArgs {
  std::string dir, messages, tools;
  bool add_generation_prompt = false, no_think = false;
  std::vector<std::string> kwargs;
};

// "--kwarg name=value": the value is JSON when it parses as JSON, otherwise a string.
void add_kwarg(ordered_json& kwargs, const std::string& spec) {
  const size_t eq = spec.find('=');
  check(eq != std::string::npos && eq > 0, "--kwarg: expected name=value, got '" + spec + "'");
  const std::string value = spec.substr(eq + 1);
  const auto parsed = ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
  kwargs[spec.substr(0, eq)] = parsed.is_discarded() ? ordered_json(value) : parsed;
}

void run_template(const TemplateArgs& a) {
  ChatRequest req;
  const ordered_json doc = read_json_file(a.messages, "--messages");
  // Either a list of messages or an object holding "messages" (and maybe "tools").
  req.messages = doc.is_object() && doc.contains("messages") ? doc["messages"] : doc;
  check(req.messages.is_array(), "--messages: " + a.messages + " must hold a JSON list of messages or {\"messages\": [...]}");
  if (doc.is_object() && doc.contains("tools")) req.tools = doc["tools"];
  if (!a.tools.empty()) req.tools = read_json_file(a.tools, "--tools");
  req.add_generation_prompt = a.add_generation_prompt;
  if (a.no_think) req.kwargs["enable_thinking"] = false;
  for (const auto& spec : a.kwargs) add_kwarg(req.kwargs, spec);
  const std::string prompt = load_chat_template(a.dir).apply(req);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
}

void add_template(CLI::App& app) {
  auto* cmd = app.add_subcommand("template", "Render the checkpoint's chat template for a conversation");
  static TemplateArgs a;
  add_model_dir(cmd, a.dir, "Folder with tokenizer_config.json and/or chat_template.jinja, or a .gguf file");
  cmd->add_option("--messages", a.messages, "JSON file: a list of messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_option("--tools", a.tools, "JSON file with the list of tool definitions");
  cmd->add_flag("--add-generation-prompt", a.add_generation_prompt, "End with the opening of the assistant's turn");
  cmd->add_flag("--no-think", a.no_think, "Pass enable_thinking=false (Qwen3 / Qwen3.5 templates)");
  cmd->add_option("--kwarg", a.kwargs, "Extra template variable name=value (value parsed as JSON if it is JSON)");
  cmd->callback([] { run_template(a); });
}

CommandRegistrar reg_tokenize(add_tokenize);
CommandRegistrar reg_detokenize(add_detokenize);
CommandRegistrar reg_template(add_template);

}  // namespace
}  // namespace petrel::cli
