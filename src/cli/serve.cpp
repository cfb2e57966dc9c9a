// `petrel serve DIR`: an OpenAI-compatible HTTP server (docs/serving.md). The listener starts
// first (so /health answers 503 while the weights load), then the model and its scheduler.
// SIGINT/SIGTERM stop it gracefully: new requests get 503, idle and stalled connections are
// closed, running requests may finish for --shutdown-timeout seconds, the rest are cancelled, and
// the program exits with status 0.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>

#include "cli/common.h"
#include "cli/number_flags.h"
#include "cli/registry.h"
#include "core/error.h"
#include "io/model_folder.h"
#include "runtime/loaded_model.h"
#include "server/http_server.h"

namespace petrel::cli {
namespace {

using namespace std::chrono_literals;

struct Args {
  server::ServeOptions serve;
  server::HttpOptions http;
  double shutdown_timeout_s = 10.0;
  std::string speculative;  // "" or "mtp"
  int draft = 0;            // 0: kMtpDraft
  int prefix_cache_host_mb = -1;  // -1: by device (prefix_cache_host_default_mb)
};

// SIGINT and SIGTERM are blocked in every thread (threads inherit the mask of their creator) and
// taken synchronously by this thread, which decides what they mean at each stage.
class Signals {
 public:
  Signals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  // True when a signal came within `timeout`.
  bool wait(std::chrono::milliseconds timeout) const {
    const timespec ts{time_t(timeout.count() / 1000), long(timeout.count() % 1000) * 1000000L};
    return sigtimedwait(&set_, nullptr, &ts) > 0;
  }

 private:
  sigset_t set_;
};

// The model loads on a thread so that a signal can still end the program meanwhile.
std::unique_ptr<server::ServedModel> load(const Args& a, const Signals& signals, server::HttpServer& http) {
  auto loading = std::async(std::launch::async, [&a] { return std::make_unique<server::ServedModel>(a.serve); });
  while (loading.wait_for(0s) != std::future_status::ready) {
    if (!signals.wait(100ms)) continue;
    std::fprintf(stderr, "petrel serve: interrupted while loading\n");
    http.stop();
    std::_Exit(0);  // the loader cannot be interrupted, and exiting normally would wait for it
  }
  return loading.get();
}

// Refuses new work, lets running requests finish (until the timeout or a second signal), then
// cancels what is left and stops listening.
void shut_down(server::ServerState& state, const Signals& signals, server::HttpServer& http, double timeout_s) {
  state.begin_draining();
  std::fprintf(stderr, "petrel serve: shutting down (running requests get %.0f s; a second signal cancels them)\n",
               timeout_s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!state.wait_idle(100ms) && std::chrono::steady_clock::now() < deadline && !signals.wait(0ms)) {
  }
  state.model()->scheduler().shutdown(/*drain=*/false);
  state.wait_idle(2s);  // cancelled requests write their last event
  http.stop(2s);
  state.release_model();
}

void serve(const Args& a) {
  // Before listening: a wrong path needs no port.
  if (a.serve.synthetic.empty()) check_checkpoint_folder(a.serve.dir);
  else check_synthetic(a.serve.synthetic, a.serve.load);
  const Signals signals;
  server::ServerState state;
  server::HttpOptions http_options = a.http;
  // A streaming response holds a connection thread: room for every running and queued request.
  http_options.threads = a.serve.scheduler.max_sequences + a.serve.scheduler.max_queued + 8;
  server::HttpServer http(state, http_options);
  http.start();
  std::fprintf(stderr, "petrel serve: listening on http://%s:%d (loading %s)\n", a.http.host.c_str(), http.port(),
               a.serve.synthetic.empty() ? a.serve.dir.c_str() : a.serve.synthetic.c_str());
  state.set_ready(load(a, signals, http));
  std::fprintf(stderr, "petrel serve: ready: %s as \"%s\"\n", state.model()->summary().c_str(),
               state.model()->name().c_str());
  while (!signals.wait(1000ms)) {
  }
  shut_down(state, signals, http, a.shutdown_timeout_s);
  std::fprintf(stderr, "petrel serve: stopped\n");
}

// The limits that keep any one client from crashing, exhausting or starving the server.
void add_limit_flags(CLI::App* cmd, server::HttpOptions& http) {
  cmd->add_option("--max-body", http.max_body_bytes, "Largest request body in bytes (413 beyond; compressed bodies get 415)")
      ->capture_default_str()->check(integer_in(size_t(1), size_t(1) << 32));
  cmd->add_option("--max-header-bytes", http.max_header_bytes, "Largest request line and headers together, in bytes (431 beyond)")
      ->capture_default_str()->check(integer_in(size_t(256), size_t(16) << 20));
  cmd->add_option("--max-headers", http.max_headers, "Most headers in one request (431 beyond)")
      ->capture_default_str()->check(integer_in(1, 100000));
  cmd->add_option("--max-connections", http.max_connections, "Connections open at once (503 beyond)")
      ->capture_default_str()->check(integer_in(1, 1 << 20));
  cmd->add_option("--header-timeout", http.header_timeout_s,
                  "Seconds a connection may take to send a request's headers, idle keep-alive time included (408)")
      ->capture_default_str()->check(number_in(0.1, 3600.0));
  cmd->add_option("--body-timeout", http.body_timeout_s, "Seconds a request's body may take to arrive after its headers (408)")
      ->capture_default_str()->check(number_in(0.1, 3600.0));
  cmd->add_option("--write-timeout", http.write_timeout_s, "Seconds a response write may make no progress before the connection is cut")
      ->capture_default_str()->check(number_in(0.1, 3600.0));
}

void add(CLI::App& app) {
  static Args a;
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/serving.md)");
  add_model_dir(cmd, a.serve.dir, "Checkpoint folder (or use --synthetic)", /*required=*/false);
  cmd->add_option("--synthetic", a.serve.synthetic,
                  "Serve random weights of a released shape (CUDA; for speed work): qwen3.5-35b-a3b, "
                  "qwen3-next-80b-a3b, qwen3-30b-a3b; with --tokenizer");
  cmd->add_option("--tokenizer", a.serve.tokenizer,
                  "--synthetic: a folder with the tokenizer.json (and chat template) requests are read with");
  cmd->add_option("--host", a.http.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a.http.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()->check(integer_in(0, 65535));
  cmd->add_option("--api-key", a.http.api_key, "Require \"Authorization: Bearer KEY\" (all routes but /health)")
      ->check(CLI::Validator([](std::string& key) { return key.empty() ? "an empty key would let anyone in" : ""; }, "KEY", "non-empty"));
  cmd->add_option("--model-name", a.serve.model_name, "Model id clients use (default: the folder's name)");
  cmd->add_option("--max-sequences", a.serve.scheduler.max_sequences,
                  "Sequences decoded together, at most (fewer when their states do not fit --gpu-memory-fraction)")
      ->capture_default_str()->check(integer_in(1));
  cmd->add_option("--gpu-memory-fraction", a.serve.scheduler.memory_fraction,
                  "Share of the GPU memory free after loading that sequence states and the prefix cache may take "
                  "(0: no limit)")
      ->capture_default_str()->check(number_in(0.0, 1.0));
  cmd->add_option("--max-queued", a.serve.scheduler.max_queued, "Requests waiting for a slot before 429s")
      ->capture_default_str()->check(integer_in(0));
  cmd->add_option("-c,--context,--ctx-size", a.serve.scheduler.context, "Tokens per sequence, prompt and answer (at most the model's)")
      ->capture_default_str()->check(integer_in(1));
  cmd->add_option("--chunk", a.serve.scheduler.prefill_chunk, "Prompt tokens a decode step carries")
      ->capture_default_str()->check(integer_in(1));
  cmd->add_option("--prefill-burst", a.serve.scheduler.prefill_burst,
                  "Prompt tokens a step reads while no sequence decodes (prompts that wait together)")
      ->capture_default_str()->check(integer_in(1));
  cmd->add_option_function<int>(
         "--prefix-cache-mb",
         [](int mb) { a.serve.scheduler.prefix_cache.budget_bytes = size_t(mb) << 20; },
         "Memory for snapshots of prompt prefixes that later requests reuse (0: no prefix cache; default 4096)")
      ->check(integer_in(0));
  cmd->add_option("--prefix-cache-host-mb", a.prefix_cache_host_mb,
                  "Host memory that prefix snapshots pushed out of --prefix-cache-mb move to instead of being dropped "
                  "(0: dropped; default 8192 on CUDA, 0 on the CPU, whose snapshots are in host memory already)")
      ->check(integer_in(0));
  cmd->add_option("-n,--max-tokens", a.serve.max_tokens, "Answer length when a request sets none (-1: to EOS or a full context)")
      ->capture_default_str()->check(integer_in(-1));
  cmd->add_option_function<std::string>(
         "--special-tokens-in-content",
         [](const std::string& v) {
           a.serve.special_tokens_in_content =
               v == "special" ? server::ClientSpecialTokens::Special : server::ClientSpecialTokens::Text;
         },
         "Special-token text in what chat clients send: text (encoded as plain text, as OpenAI does; default) "
         "or special (encoded as the tokens)")
      ->option_text("text|special")->check(CLI::IsMember({"text", "special"}));
  add_limit_flags(cmd, a.http);
  cmd->add_option("--max-json-depth", a.serve.max_json_depth,
                  "Deepest nesting of a request body's JSON (400 beyond; JSON inside strings and in tool calls the model writes is capped at 64)")
      ->capture_default_str()->check(integer_in(1, 256));
  cmd->add_flag("!--no-request-log", a.http.log_requests,
                "No line per request on stderr (default: time, method, path, status, tokens, duration, client)");
  cmd->add_option("--shutdown-timeout", a.shutdown_timeout_s, "Seconds running requests may take to finish on SIGINT/SIGTERM")
      ->capture_default_str()->check(number_in(0.0));
  cmd->add_option("--speculative", a.speculative,
                  "Speculative decoding with the checkpoint's draft head while one request runs alone (off when "
                  "more run; docs/serving.md)")
      ->check(CLI::IsMember({"mtp"}));
  cmd->add_option("--draft-tokens", a.draft, "Most tokens drafted per step with --speculative (default " +
                                                 std::to_string(kMtpDraft) + ")")
      ->check(integer_in(1, 64));
  add_device_flags(cmd, a.serve.load);
  cmd->callback([] {
    check(a.serve.dir.empty() != a.serve.synthetic.empty(),
          "petrel serve: give a checkpoint DIR or --synthetic NAME (not both)");
    check(a.serve.synthetic.empty() == a.serve.tokenizer.empty(),
          "petrel serve: --synthetic and --tokenizer go together (random weights need a tokenizer to read requests with)");
    check(a.draft == 0 || !a.speculative.empty(), "--draft-tokens: only with --speculative");
    if (!a.speculative.empty()) {
      a.serve.scheduler.speculative.source = DraftSource::Mtp;
      a.serve.scheduler.speculative.draft = a.draft > 0 ? a.draft : kMtpDraft;
    }
    check(a.serve.max_tokens == -1 || a.serve.max_tokens > 0,
          "--max-tokens: expected a positive count or -1 (no limit), found " + std::to_string(a.serve.max_tokens));
    // The model's chunk holds a prompt piece beside one decode row per sequence (Scheduler::step),
    // the prompts a step reads while none decodes, or a verify step: the pending token and the draft.
    a.serve.load.max_chunk = std::max({a.serve.scheduler.prefill_chunk + a.serve.scheduler.max_sequences,
                                       a.serve.scheduler.prefill_burst, a.serve.scheduler.speculative.draft + 1});
    const int host_mb = a.prefix_cache_host_mb >= 0 ? a.prefix_cache_host_mb
                                                    : prefix_cache_host_default_mb(a.serve.load.device);
    a.serve.scheduler.prefix_cache.host_budget_bytes = size_t(host_mb) << 20;
    a.serve.load.progress = false;
    serve(a);
  });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
