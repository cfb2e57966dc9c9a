// `petrel bench`: prefill and batch-1 decode throughput (median of several runs), bytes moved per
// decode token and the fraction of the measured memory bandwidth it represents, on the GPU (CUDA
// backend) or the CPU (the CPU backend, a checkpoint's weights as stored); or, with --multi-turn,
// a chat's time to first token with and without the prefix cache (cli/bench_multi_turn.h); with
// --speculative, decode through the generation loop with and without drafts (cli/bench_speculative.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/host_memory.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_trace.h"
#include "cli/bench_arrivals.h"
#include "cli/bench_multi_turn.h"
#include "cli/bench_speculative.h"
#include "cli/common.h"
#include "cli/json_schema_flag.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/checkpoint.h"
#include "io/model_tokenizer.h"
#include "model/fp8_quantize.h"
#include "model/synthetic.h"
#include "runtime/loaded_model.h"
#include "runtime/scheduler.h"

namespace petrel::cli {
namespace {

struct Args {
  std::string dir, synthetic, device = "auto", weights = "int4", prefill = "512,2048,8192", contexts = "0,4096",
                                   concurrency;
  int decode_tokens = 64, runs = 5, chunk = 8192, threads = 0;
  bool json = false, graphs = true, breakdown = false;
  int breakdown_batch = 32;
  bool multi_turn = false;
  MultiTurnOptions turns;
  int cache_host_mb = -1;  // --multi-turn's --prefix-cache-host-mb; -1: by device, as petrel serve
  int serving_chunk = 512;  // prompt tokens a serving step carries
  int serving_burst = SchedulerOptions{}.prefill_burst;  // and while no stream decodes
  ArrivalOptions arrival{.prompt_tokens = 0};  // --arrivals: off unless given a prompt length
  std::string speculative;  // "", "mtp" or "ngram"
  int draft = 0;            // 0: the source's default
  double accept_rate = -1;  // < 0: drafts verified as sampled
  std::string json_schema, tokenizer;  // --concurrency again with every request held to the schema
  // Which of --weights, --prefill, --decode-context, --decode-tokens the command line set: the CPU
  // takes sizes of its own where they are left out, and no --weights.
  bool weights_set = false, prefill_set = false, contexts_set = false, decode_tokens_set = false;
};

// The CPU's sizes where the command line leaves them out: a laptop's minute, not a GPU's.
constexpr const char* kCpuPrefill = "128,512";
constexpr const char* kCpuContexts = "0,512";
constexpr int kCpuDecodeTokens = 32;

struct Stat {
  double median = 0, min = 0, max = 0;
  std::vector<double> runs;  // in the order they ran: a drift or an outlier shows in the JSON
};

Stat stats(const std::vector<double>& runs) {
  std::vector<double> v = runs;
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back(), runs};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Where a decode token's weights are read from: the CUDA backend's int4 or bf16 copies, or the
// checkpoint's own tensors on the host (the CPU backend, whose KV cache is fp32).
enum class WeightBytes { CudaInt4, CudaAsStored, Host };

bool gguf_mix(const std::string& weights) {
  const std::vector<std::string> mixes = synthetic_gguf_mixes();
  return std::find(mixes.begin(), mixes.end(), weights) != mixes.end();
}

// Bytes a decode step of `rows` sequences reads and writes: every non-expert weight, the distinct
// experts its rows route to (expected, for uniform routing: each expert is missed by all rows with
// probability (1 - top_k/experts)^rows; top_k for one row) and the shared expert per layer, the LM
// head, and each row's DeltaNet state (read + write) and KV cache up to `ctx`.
double decode_bytes(const ModelConfig& c, const ModelWeights& w, WeightBytes where, int ctx, int rows = 1) {
  auto bytes = [&](const Matrix& m, bool router_like) -> double {
    if (!m.valid()) return 0;
    if (m.format == MatrixFormat::Affine || where == WeightBytes::Host) return double(m.bytes());
    if (const GgmlAffineForm a = m.format == MatrixFormat::Gguf ? ggml_affine_form(m.ggml) : GgmlAffineForm{}; a.bits)
      return double(m.rows * m.cols) * a.bits / 8 + 4.0 * double(m.rows * (m.cols / a.group));  // as uploaded
    if (m.format == MatrixFormat::Gguf && ggml_is_iq4(m.ggml) && where == WeightBytes::CudaAsStored)
      return double(m.rows * m.cols) / 2 + 4.0 * double(m.rows * (m.cols / 32));  // codes, a scale pair per 32
    if (m.format == MatrixFormat::Fp8 && where == WeightBytes::CudaAsStored)  // codes, a scale pair per 128 columns
      return double(m.rows * m.cols) + 4.0 * double(m.rows * ((m.cols + 127) / 128));
    if (where == WeightBytes::CudaInt4 && m.cols % 64 == 0)
      return double(m.rows * m.cols) * (router_like ? 1.0 : 0.5) + 4.0 * double(m.rows * (m.cols / 64));
    return 2.0 * double(m.rows * m.cols);
  };
  const double kv_elem = where == WeightBytes::Host ? 4.0 : 2.0;
  double total = bytes(w.lm_head, false) + 2.0 * c.hidden * rows;
  for (const LayerWeights& L : w.layers) {
    for (const Matrix* m : {&L.attn.q, &L.attn.gate, &L.attn.k, &L.attn.v, &L.attn.o, &L.gdn.qkv, &L.gdn.z, &L.gdn.b,
                            &L.gdn.a, &L.gdn.out, &L.ffn.dense.gate, &L.ffn.dense.up, &L.ffn.dense.down,
                            &L.ffn.shared.gate, &L.ffn.shared.up, &L.ffn.shared.down})
      total += bytes(*m, false);
    total += bytes(L.ffn.router, true) + bytes(L.ffn.shared_gate, true);
    if (!L.ffn.experts.empty()) {
      const MlpWeights& e = L.ffn.experts[0];
      const double hit = 1.0 - std::pow(1.0 - double(c.top_k) / c.n_experts, rows);
      total += c.n_experts * hit * (bytes(e.gate, false) + bytes(e.up, false) + bytes(e.down, false));
    }
    if (L.kind == LayerKind::DeltaNet)
      total += rows * 2.0 * 4.0 * c.lin_v_heads * c.lin_k_dim * c.lin_v_dim;
    else
      total += rows * 2.0 * kv_elem * double(ctx) * c.n_kv_heads * c.head_dim;
  }
  return total;
}

std::vector<int32_t> tokens(int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = int32_t((1103515245u * uint32_t(i) + 12345u) % uint32_t(vocab));
  return ids;
}

// The prompt of a speculative decode row: for prompt lookup, a 64-token motif said at least twice,
// so that there is something to draft (random weights never repeat on their own).
std::vector<int32_t> speculative_prompt(const std::string& source, int context, int vocab) {
  if (source != "ngram") return tokens(std::max(context, 1), vocab);
  constexpr int kMotif = 64;
  const std::vector<int32_t> motif = tokens(kMotif, vocab);
  std::vector<int32_t> ids(size_t(std::max(context, 2 * kMotif)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = motif[i % kMotif];
  return ids;
}

// Device time per op label, sorted by time, from the timer's totals over `steps` forward calls.
nlohmann::json op_rows(std::vector<std::pair<std::string, double>> times, int steps) {
  std::sort(times.begin(), times.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [label, seconds] : times) rows.push_back({{"op", label}, {"us", 1e6 * seconds / steps}});
  return rows;
}

// Device time per op of one decode step at context 0 (mean of several steps) and of one prefill
// of `prefill_tokens`, each op timed on its own (no graph), so the decode sum exceeds a replayed
// step by the launch gaps.
nlohmann::json op_breakdown(Model& model, Backend& backend, int vocab, int prefill_tokens, int batch) {
  constexpr int kSteps = 8;
  const std::vector<int32_t> prompt = tokens(16, vocab);
  auto seq = model.new_sequence(int(prompt.size()) + kSteps + 4);
  int32_t tok = model.forward_greedy(prompt.data(), int(prompt.size()), *seq);
  check(backend.time_ops(true), "--breakdown: the " + backend.name() + " backend cannot time its ops");
  backend.take_op_times();
  for (int i = 0; i < kSteps; ++i) tok = model.forward_greedy(&tok, 1, *seq);
  nlohmann::json out;
  out["decode"] = op_rows(backend.take_op_times(), kSteps);
  // One batched step of `batch` sequences (what the scheduler runs while serving).
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<SequenceState*> rows;
  std::vector<int32_t> next(batch);
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(model.new_sequence(int(prompt.size()) + kSteps + 4));
    rows.push_back(seqs.back().get());
    next[size_t(b)] = model.forward_greedy(prompt.data() + b % 4, int(prompt.size()) - b % 4, *seqs.back());
  }
  std::vector<float> logits(size_t(batch) * size_t(vocab));
  model.forward_batch(next.data(), rows.data(), batch, logits.data());
  backend.take_op_times();
  model.forward_batch(next.data(), rows.data(), batch, logits.data());
  out["batch"] = op_rows(backend.take_op_times(), 1);
  out["batch_size"] = batch;
  const std::vector<int32_t> ids = tokens(prefill_tokens, vocab);
  auto long_seq = model.new_sequence(prefill_tokens);
  model.forward_greedy(ids.data(), prefill_tokens, *long_seq);
  out["prefill"] = op_rows(backend.take_op_times(), 1);
  out["prefill_tokens"] = prefill_tokens;
  backend.time_ops(false);
  return out;
}

// Whether a block of b fits on a Hopper multiprocessor (64K registers allocated per warp in units
// of 256, 228 KB of shared memory with 1 KB reserved per block, 2048 threads) beside a block of a.
bool fit_side_by_side(const cuda::KernelRecord& a, const cuda::KernelRecord& b) {
  auto regs = [](const cuda::KernelRecord& k) { return (k.threads + 31) / 32 * ((k.registers * 32 + 255) / 256 * 256); };
  return regs(a) + regs(b) <= 65536 && a.shared_bytes + b.shared_bytes + 2048 <= 228 * 1024 &&
         a.threads + b.threads <= 2048;
}

// Each serving request's prompt and reply, in tokens.
constexpr int kServingPrompt = 128, kServingGenerated = 128;

// Kernels of `steps` replays of a recorded step as the device ran them (CUPTI). Kernels launched
// with PDL overlap their predecessor (they start early and wait), so each kernel is charged the
// time from the end of everything before it to its own end: the part of the step it alone
// accounts for. The rest of the step is idle time between kernels (launch gaps that fusion or PDL
// would remove).
nlohmann::json traced_steps(const std::function<void()>& step, int steps, bool with_timeline = true) {
  cuda::KernelTrace trace;
  trace.start();
  for (int i = 0; i < steps; ++i) step();
  const std::vector<cuda::KernelRecord> records = trace.stop();
  // Per kernel and grid size: one kernel's launches over matrices of other shapes differ widely.
  struct Charge {
    double own_ns = 0, ran_ns = 0;  // its share of the critical path; start to end
    int launches = 0;
  };
  std::map<std::string, Charge> per_name;
  double busy = 0;
  uint64_t done = records.empty() ? 0 : records.front().start_ns;  // end of everything so far
  for (const auto& r : records) {
    const double own = r.end_ns > done ? double(r.end_ns - std::max(r.start_ns, done)) : 0.0;
    done = std::max(done, r.end_ns);
    Charge& c = per_name[r.name + " x" + std::to_string(r.blocks) + " blocks"];
    c.own_ns += own;
    c.ran_ns += double(r.end_ns - r.start_ns);
    ++c.launches;
    busy += own;
  }
  const double wall = records.empty() ? 0.0 : double(records.back().end_ns - records.front().start_ns);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [name, c] : per_name)
    rows.push_back({{"kernel", name},
                    {"us", c.own_ns / 1e3 / steps},
                    {"launches", double(c.launches) / steps},
                    {"ran_us_each", c.ran_ns / 1e3 / c.launches}});
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a["us"] > b["us"]; });
  // One whole step as the device ran it (the last replay): start and end of each kernel, in us
  // from the step's first start, to see what overlaps and what waits; and its launch shape, with
  // whether one of its blocks fits on a multiprocessor beside one of the previous kernel's (else
  // it starts only where that kernel's blocks have left: no work before its dependency wait).
  nlohmann::json timeline = nlohmann::json::array();
  const size_t per_step = with_timeline ? records.size() / size_t(steps) : 0;
  for (size_t i = records.size() - per_step; i < records.size(); ++i) {
    const uint64_t t0 = records[records.size() - per_step].start_ns;
    const cuda::KernelRecord& r = records[i];
    timeline.push_back({{"kernel", r.name},
                        {"start_us", double(r.start_ns - t0) / 1e3},
                        {"end_us", double(r.end_ns - t0) / 1e3},
                        {"blocks", r.blocks},
                        {"threads", r.threads},
                        {"registers", r.registers},
                        {"shared_kb", r.shared_bytes / 1024.0},
                        {"fits_beside_previous", i > 0 && fit_side_by_side(records[i - 1], r)}});
  }
  return {{"kernels", rows},
          {"timeline", timeline},
          {"step_us", wall / 1e3 / steps},
          {"busy_us", busy / 1e3 / steps},
          {"launches", double(records.size()) / steps}};
}

constexpr int kTracedSteps = 16;

// The replayed decode step after a prompt of `context` tokens (at least 16).
nlohmann::json graph_kernels(Model& model, int vocab, int context) {
  const std::vector<int32_t> prompt = tokens(std::max(context, 16), vocab);
  auto seq = model.new_sequence(int(prompt.size()) + kTracedSteps + 8);
  int32_t tok = model.forward_greedy(prompt.data(), int(prompt.size()), *seq);
  for (int i = 0; i < 3; ++i) tok = model.forward_greedy(&tok, 1, *seq);  // run, record, replay
  nlohmann::json out = traced_steps([&] { tok = model.forward_greedy(&tok, 1, *seq); }, kTracedSteps);
  out["context"] = context;
  return out;
}

// The replayed batched step of `batch` sequences (what the scheduler runs while serving), each
// after a 16-token prompt; the logits stay on the device, as a device sampler reads them.
nlohmann::json batch_graph_kernels(Model& model, int vocab, int batch) {
  const std::vector<int32_t> prompt = tokens(16, vocab);
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<SequenceState*> rows;
  std::vector<int32_t> next(static_cast<size_t>(batch), 0);
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(model.new_sequence(int(prompt.size()) + kTracedSteps + 8));
    rows.push_back(seqs.back().get());
    next[size_t(b)] = model.forward_greedy(prompt.data(), int(prompt.size()), *seqs.back());
  }
  for (int i = 0; i < 3; ++i) model.forward_batch_device(next.data(), rows.data(), batch);  // run, record, replay
  nlohmann::json out = traced_steps([&] { model.forward_batch_device(next.data(), rows.data(), batch); }, kTracedSteps);
  out["rows"] = batch;
  return out;
}

void print_graph_kernels(const nlohmann::json& g) {
  const std::string what =
      g.contains("rows")                ? "batched step of " + std::to_string(g["rows"].get<int>()) + " rows"
      : g.contains("generation_tokens") ? "speculative generation of " +
                                              std::to_string(g["generation_tokens"].get<int>()) + " tokens"
      : g.contains("serving_streams")
          ? "serving run of " + std::to_string(g["serving_streams"].get<int>()) + " streams (prompts of " +
                std::to_string(kServingPrompt) + " tokens, " + std::to_string(kServingGenerated) + " generated each)"
          : "decode step at context " + std::to_string(g["context"].get<int>());
  const char* where = g.contains("generation_tokens") || g.contains("serving_streams") ? "" : " in a replayed graph";
  std::printf("\n%s%s (CUPTI): %.0f us, kernels busy %.0f us, idle %.0f us, %.0f launches\n", what.c_str(), where,
              g["step_us"].get<double>(), g["busy_us"].get<double>(),
              g["step_us"].get<double>() - g["busy_us"].get<double>(), g["launches"].get<double>());
  constexpr size_t kShown = 24;  // the rest are in the JSON
  const auto& rows = g["kernels"];
  for (size_t i = 0; i < std::min(rows.size(), kShown); ++i) {
    const auto& r = rows[i];
    std::printf("  %-72s %8.1f us  x%-4.0f %6.1f us each\n", r["kernel"].get<std::string>().substr(0, 72).c_str(),
                r["us"].get<double>(), r["launches"].get<double>(), r["ran_us_each"].get<double>());
  }
  if (rows.size() > kShown) std::printf("  ... %zu more kernel shapes (--json)\n", rows.size() - kShown);
}

void print_op_rows(const char* title, const nlohmann::json& rows) {
  double total = 0;
  for (const auto& r : rows) total += r["us"].get<double>();
  std::printf("\n%s, ops timed one by one (total %.0f us)\n", title, total);
  for (const auto& r : rows)
    std::printf("  %-28s %9.1f us  %5.1f%%\n", r["op"].get<std::string>().c_str(), r["us"].get<double>(),
                100.0 * r["us"].get<double>() / total);
}

// Requests held to a structured output's grammar (the ids that may end an answer with it).
struct StructuredRequests {
  std::shared_ptr<const grammar::TokenGrammar> grammar;
  std::vector<int32_t> eos_ids;
};

// What one serving run gave: tokens generated, its seconds, and per request its TTFT and decode rate.
struct ServingRun {
  long generated = 0;
  double seconds = 0;
  std::vector<double> ttft_ms, stream_rates;
};

// n requests (distinct prompts of kServingPrompt tokens, greedy, kServingGenerated tokens each)
// submitted at once to `scheduler`, waited for.
ServingRun serve_requests(Scheduler& scheduler, int n, int vocab, const StructuredRequests& structured) {
  std::mutex m;
  std::condition_variable cv;
  int finished = 0;
  std::string error;
  ServingRun run;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    CompletionRequest req;
    req.prompt = tokens(kServingPrompt + i, vocab);
    req.prompt.erase(req.prompt.begin(), req.prompt.begin() + i);  // a distinct prompt per request
    req.sampling.temperature = 0.0f;
    req.max_tokens = kServingGenerated;
    req.grammar = structured.grammar;
    if (structured.grammar) req.eos_ids = structured.eos_ids;
    const SubmitStatus status = scheduler.submit(std::move(req), [&](const StepEvent& e) {
      std::lock_guard<std::mutex> lock(m);
      if (e.token >= 0) ++run.generated;
      if (e.done) {
        if (!e.error.empty()) error = e.error;
        run.ttft_ms.push_back(e.stats.ttft_s * 1e3);
        run.stream_rates.push_back(e.stats.decode_tokens_per_s());
        ++finished;
        cv.notify_all();
      }
      return true;
    });
    check(status == SubmitStatus::Accepted, "--concurrency: the scheduler refused request " + std::to_string(i));
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return finished == n; });
  check(error.empty(), "--concurrency: " + error);
  run.seconds = seconds_since(t0);
  return run;
}

// The prompt tokens a serving step carries beside decode rows, and while none decodes.
struct ServingSteps {
  int chunk = 0, burst = 0;
};

SchedulerOptions serving_options(int n, const ServingSteps& steps, const SpeculativeOptions& speculative) {
  SchedulerOptions so;
  so.max_sequences = n;
  so.max_queued = n;
  so.context = kServingPrompt + kServingGenerated + 8;
  so.prefill_chunk = steps.chunk;
  so.prefill_burst = steps.burst;
  so.speculative = speculative;
  return so;
}

// Generated tokens per second with n concurrent greedy requests (distinct 128-token prompts, at
// most 128 tokens each) through the continuous-batching scheduler, median of `runs` after a
// warm-up, and its fraction of the bandwidth bound: step_bytes(n) read per step of n tokens; with
// the scheduler's speculative decoding when `speculative` drafts, held to `structured`'s grammar
// when it has one (an answer may then end early: the tokens generated are counted).
nlohmann::json serving_throughput(Model& model, int vocab, const std::vector<int>& concurrency, int runs,
                                  const ServingSteps& steps, const SpeculativeOptions& speculative,
                                  const std::function<double(int)>& step_bytes, double bandwidth,
                                  const StructuredRequests& structured = {}) {
  nlohmann::json rows = nlohmann::json::array();
  for (int n : concurrency) {
    Scheduler scheduler(model, serving_options(n, steps, speculative));
    std::vector<double> tps, ttft_ms, stream_rates;  // the last two per request of the timed runs
    for (int r = 0; r <= runs; ++r) {
      const ServingRun run = serve_requests(scheduler, n, vocab, structured);
      if (r == 0) continue;  // the warm-up records the step graphs
      tps.push_back(double(run.generated) / run.seconds);
      ttft_ms.insert(ttft_ms.end(), run.ttft_ms.begin(), run.ttft_ms.end());
      stream_rates.insert(stream_rates.end(), run.stream_rates.begin(), run.stream_rates.end());
    }
    const Stat st = stats(tps);
    const double bytes = step_bytes(n);
    rows.push_back({{"concurrency", n},
                    {"tok_per_s", st.median},
                    {"min", st.min},
                    {"max", st.max},
                    {"runs_tok_per_s", st.runs},
                    {"bytes_per_step", bytes},
                    {"fraction_of_bandwidth", bytes * st.median / n / bandwidth},
                    {"ttft_p50_ms", stats(ttft_ms).median},
                    {"stream_decode_tok_per_s", stats(stream_rates).median}});
  }
  return rows;
}

// The kernels of one whole serving run of n streams after a warm-up run (CUPTI): the device's
// idle time between them is what the host adds to the replayed steps (scheduling, sampling,
// emitting, launching).
nlohmann::json serving_kernels(Model& model, int vocab, int n, const ServingSteps& steps) {
  Scheduler scheduler(model, serving_options(n, steps, {}));
  serve_requests(scheduler, n, vocab, {});
  nlohmann::json out = traced_steps([&] { serve_requests(scheduler, n, vocab, {}); }, 1, false);
  out["serving_streams"] = n;
  return out;
}

// The CPU's refusals, before any weights are read: what only the CUDA backend measures.
void check_cpu_args(const Args& a) {
  if (a.dir.empty()) {
    const std::string why = a.device == "auto" ? "no CUDA GPU here (" + cuda_device_summary() + ")" : "--device cpu";
    throw Error("petrel bench --synthetic measures the CUDA backend, and " + why +
                ": on the CPU give a checkpoint DIR (the synthetic shapes have no weights on the host)");
  }
  check(!a.weights_set, "--weights applies to --device cuda; the CPU reads the checkpoint's weights as stored");
  check(!a.breakdown, "--breakdown times the CUDA backend's kernels; it has no CPU form");
  check(a.graphs, "--no-cuda-graphs applies to --device cuda");
}

// --multi-turn times only the conversation: the flags of the other measurements would be ignored.
void check_multi_turn_args(const Args& a) {
  check(!a.prefill_set && !a.contexts_set && !a.decode_tokens_set && a.concurrency.empty() && !a.breakdown &&
            a.speculative.empty(),
        "--multi-turn runs on its own: leave out --prefill, --decode-context, --decode-tokens, --concurrency, "
        "--breakdown and --speculative");
}

// --speculative's options; refuses --draft-tokens and --draft-accept-rate without it.
SpeculativeBench speculative_bench(const Args& a, const ModelConfig& config) {
  check(!a.speculative.empty() || (a.draft == 0 && a.accept_rate < 0),
        "--draft-tokens and --draft-accept-rate: only with --speculative");
  SpeculativeBench o;
  const bool mtp = a.speculative == "mtp";
  check(!mtp || config.mtp_layers > 0,
        "--speculative mtp needs a checkpoint with a multi-token prediction head (mtp.* tensors); this one has none");
  o.speculative.source = mtp ? DraftSource::Mtp : DraftSource::Ngram;
  o.speculative.draft = a.draft > 0 ? a.draft : mtp ? kMtpDraft : kNgramDraft;
  if (a.accept_rate >= 0) o.speculative.forced_acceptance = a.accept_rate;
  check(a.concurrency.empty() || a.speculative.empty() || (mtp && a.accept_rate < 0),
        "--concurrency with --speculative: the scheduler drafts with the MTP head only and verifies every draft; "
        "leave out --draft-accept-rate (or --concurrency)");
  o.decode_tokens = a.decode_tokens;
  o.runs = a.runs;
  return o;
}

// --json-schema's requests: the schema compiled for the model's vocabulary rows with the tokenizer
// of DIR (or --tokenizer's folder), ending at the model's EOS ids or the tokenizer's end tokens.
StructuredRequests structured_requests(const Args& a, const ModelConfig& config) {
  if (a.json_schema.empty()) return {};
  const std::string dir = a.tokenizer.empty() ? a.dir : a.tokenizer;
  check(!dir.empty(), "--json-schema on --synthetic weights needs --tokenizer DIR (a folder with tokenizer.json)");
  const Tokenizer tokenizer = load_tokenizer(dir);
  StructuredRequests r;
  r.grammar = schema_grammar(a.json_schema, tokenizer, config.vocab);
  for (int id : config.eos_ids) r.eos_ids.push_back(id);
  for (const char* end : {"<|im_end|>", "<|endoftext|>"})
    if (r.eos_ids.empty())
      if (const auto id = tokenizer.token_id(end); id && int(*id) < config.vocab) r.eos_ids.push_back(int32_t(*id));
  return r;
}

void run(Args a) {
  check(a.dir.empty() != a.synthetic.empty(), "petrel bench: give a checkpoint DIR or --synthetic NAME (not both)");
  check(a.json_schema.empty() || !a.concurrency.empty(),
        "--json-schema needs --concurrency: the serving run it repeats with structured output");
  check(a.tokenizer.empty() || !a.json_schema.empty(), "--tokenizer: only with --json-schema");
  if (a.multi_turn) check_multi_turn_args(a);
  check(a.arrival.prompt_tokens == 0 || !a.concurrency.empty(),
        "--arrivals needs --concurrency: the streams that decode while the prompts arrive");
  const bool cpu = resolve_device(a.device) == "cpu";
  if (cpu) {
    check_cpu_args(a);
    if (!a.prefill_set) a.prefill = kCpuPrefill;
    if (!a.contexts_set) a.contexts = kCpuContexts;
    if (!a.decode_tokens_set) a.decode_tokens = kCpuDecodeTokens;
  } else {
    check(a.weights == "int4" || a.weights == "bf16" || a.weights == "fp8" || gguf_mix(a.weights),
          "--weights '" + a.weights + "': expected int4, bf16, fp8, q4_0 or q4_k_m");
    check(!gguf_mix(a.weights) || !a.synthetic.empty(),
          "--weights " + a.weights + ": only with --synthetic (a checkpoint's matrices go up as they are stored)");
    check(cuda_available(), "petrel bench --device cuda: " + cuda_device_summary());
  }
  const bool int4 = !cpu && a.weights == "int4";
  const WeightBytes where = cpu ? WeightBytes::Host : int4 ? WeightBytes::CudaInt4 : WeightBytes::CudaAsStored;
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<ModelWeights> synth;
  ModelConfig config;
  if (!a.dir.empty()) {
    ProgressBar bar("loading " + a.dir);
    ck = Checkpoint::open(a.dir, [&](size_t done, size_t total) { bar.update(done, total); });
    config = ck->config();
  } else {
    config = synthetic_config(a.synthetic);
    // The draft head only where it drafts: its memory would otherwise be taken from the rest.
    if (a.speculative != "mtp") config.mtp_layers = 0;
    synth = synthetic_weights(config);
    if (!cpu && gguf_mix(a.weights)) store_as_gguf_mix(*synth, a.weights);
    if (!cpu && a.weights == "fp8") store_as_fp8(*synth);
  }
  // A checkpoint's float matrices as FP8, as --quantize fp8 makes them.
  std::unique_ptr<Fp8Copy> fp8;
  if (ck && !cpu && a.weights == "fp8") fp8 = std::make_unique<Fp8Copy>(ck->weights());
  const SpeculativeBench spec = speculative_bench(a, config);
  a.turns.runs = a.runs;
  a.turns.prefill_chunk = a.chunk;
  a.turns.host_cache_bytes = size_t(a.cache_host_mb >= 0 ? a.cache_host_mb : prefix_cache_host_default_mb(a.device))
                             << 20;
  if (a.multi_turn) check_multi_turn(a.turns, config);
  a.arrival.prefill_chunk = a.serving_chunk;
  const ModelWeights& weights = fp8 ? fp8->weights() : ck ? ck->weights() : *synth;
  const double bandwidth = cpu ? cpu_copy_bandwidth(a.threads) : cuda_copy_bandwidth();
  std::unique_ptr<Backend> backend;
  if (cpu) {
    backend = std::make_unique<CpuBackend>(CpuOptions{a.threads});
  } else {
    CudaOptions co;
    co.weights = int4 ? DeviceWeights::Int4 : DeviceWeights::AsStored;
    co.graphs = a.graphs;
    backend = make_cuda_backend(co);
  }
  ForwardOptions fo;
  fo.max_chunk = a.chunk;
  // Logits rows for the largest batch measured, not for a whole prefill chunk (8 GB at 8192).
  if (!a.concurrency.empty())
    for (int n : parse_ids(a.concurrency, "--concurrency")) fo.logit_rows = std::max(fo.logit_rows, n);
  fo.logit_rows = std::max(fo.logit_rows, a.breakdown_batch);
  Model model(config, weights, *backend, fo);
  if (a.arrival.prompt_tokens > 0) check_arrivals(a.arrival, model);
  const StructuredRequests structured = structured_requests(a, config);

  nlohmann::json out;
  out["model"] = ck ? a.dir : a.synthetic + " (synthetic)";
  out["weights"] = cpu ? "as stored" : a.weights;
  out["device"] = cpu ? cpu_device_summary(a.threads) : cuda_device_summary();
  out["memory_copy_bandwidth_GBps"] = bandwidth / 1e9;
  out["cuda_graphs"] = !cpu && a.graphs;
  out["runs"] = a.runs;
  if (!a.speculative.empty())
    out["speculative"] = {{"source", a.speculative},
                          {"draft_tokens", spec.speculative.draft},
                          {"forced_acceptance", a.accept_rate >= 0 ? nlohmann::json(a.accept_rate) : nullptr}};

  if (a.multi_turn) {  // only the conversation is timed
    out["multi_turn"] = multi_turn(model, a.turns);
  } else {
    for (int T : parse_ids(a.prefill, "--prefill")) {
      std::vector<double> tps;
      const std::vector<int32_t> ids = tokens(T, config.vocab);
      for (int r = 0; r <= a.runs; ++r) {  // run 0 warms up
        auto seq = model.new_sequence(T);
        backend->synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        model.forward_greedy(ids.data(), T, *seq);
        if (r > 0) tps.push_back(T / seconds_since(t0));
      }
      const Stat s = stats(tps);
      out["prefill"].push_back(
          {{"tokens", T}, {"tok_per_s", s.median}, {"min", s.min}, {"max", s.max}, {"runs_tok_per_s", s.runs}});
    }
    for (int ctx : parse_ids(a.contexts, "--decode-context")) {
      if (!a.speculative.empty()) {
        out["speculative_decode"].push_back(
            speculative_decode(model, spec, ctx, speculative_prompt(a.speculative, ctx, config.vocab)));
        continue;
      }
      std::vector<double> tps;
      const std::vector<int32_t> prompt = tokens(std::max(ctx, 1), config.vocab);
      for (int r = 0; r <= a.runs; ++r) {
        auto seq = model.new_sequence(int(prompt.size()) + a.decode_tokens + 4);
        int32_t tok = model.forward_greedy(prompt.data(), int(prompt.size()), *seq);
        for (int i = 0; i < 3; ++i) tok = model.forward_greedy(&tok, 1, *seq);  // graph capture + warm-up
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < a.decode_tokens; ++i) tok = model.forward_greedy(&tok, 1, *seq);
        if (r > 0) tps.push_back(a.decode_tokens / seconds_since(t0));
      }
      const Stat s = stats(tps);
      const double bytes = decode_bytes(config, weights, where, ctx);
      out["decode"].push_back({{"context", ctx},
                               {"tok_per_s", s.median},
                               {"min", s.min},
                               {"max", s.max},
                               {"runs_tok_per_s", s.runs},
                               {"bytes_per_token", bytes},
                               {"fraction_of_bandwidth", bytes * s.median / bandwidth}});
    }
  }
  if (!a.concurrency.empty())
    out["serving"] = serving_throughput(
        model, config.vocab, parse_ids(a.concurrency, "--concurrency"), a.runs, {a.serving_chunk, a.serving_burst},
        a.speculative.empty() ? SpeculativeOptions{} : spec.speculative,
        [&](int n) { return decode_bytes(config, weights, where, kServingPrompt + kServingGenerated / 2, n); },
        bandwidth);
  if (structured.grammar)
    out["serving_structured"] = serving_throughput(
        model, config.vocab, parse_ids(a.concurrency, "--concurrency"), a.runs, {a.serving_chunk, a.serving_burst},
        SpeculativeOptions{},
        [&](int n) { return decode_bytes(config, weights, where, kServingPrompt + kServingGenerated / 2, n); },
        bandwidth, structured);
  if (a.arrival.prompt_tokens > 0)
    for (int n : parse_ids(a.concurrency, "--concurrency"))
      out["arrivals"].push_back(serving_with_arrivals(model, n, a.arrival));
  if (a.breakdown) {
    const std::vector<int> sizes = parse_ids(a.prefill, "--prefill");
    const int T = sizes.empty() ? 2048 : *std::max_element(sizes.begin(), sizes.end());
    out["breakdown"] = op_breakdown(model, *backend, config.vocab, T, a.breakdown_batch);
    if (cuda::KernelTrace::available() && a.graphs) {
      try {  // profiling may be refused (e.g. a sandboxed driver): keep the other figures
        // One trace per decode context, to see what a long context adds.
        for (int ctx : parse_ids(a.contexts, "--decode-context"))
          out["breakdown"]["graphs"].push_back(graph_kernels(model, config.vocab, ctx));
        out["breakdown"]["graphs"].push_back(batch_graph_kernels(model, config.vocab, a.breakdown_batch));
        out["breakdown"]["graphs"].push_back(
            serving_kernels(model, config.vocab, a.breakdown_batch, {a.serving_chunk, a.serving_burst}));
        if (!a.speculative.empty()) {  // one whole generation: the verify, head and host gaps together
          const int ctx = parse_ids(a.contexts, "--decode-context").front();
          nlohmann::json g = traced_steps(
              speculative_generation(model, spec, speculative_prompt(a.speculative, ctx, config.vocab)), 1);
          g["generation_tokens"] = spec.decode_tokens + 1;
          out["breakdown"]["graphs"].push_back(g);
        }
      } catch (const Error& e) {
        out["breakdown"]["graph_error"] = e.what();
      }
    }
  }
  if (a.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  if (cpu)
    std::printf("model     %s, weights as stored\n", out["model"].get<std::string>().c_str());
  else
    std::printf("model     %s, weights %s, cuda graphs %s\n", out["model"].get<std::string>().c_str(),
                a.weights.c_str(), a.graphs ? "on" : "off");
  std::printf("device    %s\n", out["device"].get<std::string>().c_str());
  if (cpu) std::printf("memory copy  %.2f GB/s (read + write)\n", bandwidth / 1e9);
  else std::printf("HBM copy  %.2f TB/s (device-to-device, read + write)\n", bandwidth / 1e12);
  if (a.multi_turn) return print_multi_turn(out["multi_turn"]);
  std::printf("%-22s %12s %12s %12s\n", "", "median", "min", "max");
  for (const auto& p : out["prefill"])
    std::printf("prefill T=%-11d %10.0f/s %10.0f/s %10.0f/s\n", p["tokens"].get<int>(), p["tok_per_s"].get<double>(),
                p["min"].get<double>(), p["max"].get<double>());
  for (const auto& d : out["decode"])
    std::printf("decode ctx=%-10d %10.1f/s %10.1f/s %10.1f/s   %s/token, %.1f%% of %s bandwidth\n",
                d["context"].get<int>(), d["tok_per_s"].get<double>(), d["min"].get<double>(), d["max"].get<double>(),
                format_bytes(d["bytes_per_token"].get<double>()).c_str(),
                100.0 * d["fraction_of_bandwidth"].get<double>(), cpu ? "memory" : "HBM");
  if (out.contains("speculative_decode")) {
    std::printf("speculative %s, draft %d", a.speculative.c_str(), spec.speculative.draft);
    if (a.accept_rate >= 0) std::printf(", acceptance forced to %.2f", a.accept_rate);
    std::printf("\n");
    for (const auto& row : out["speculative_decode"]) print_speculative_decode(row);
  }
  if (out.contains("serving"))
    for (const auto& r : out["serving"])
      std::printf("serving n=%-10d %10.1f/s %10.1f/s %10.1f/s   generated tokens, all streams; %s/step, %.1f%% of %s "
                  "bandwidth; TTFT p50 %.1f ms, then %.1f tok/s a stream\n",
                  r["concurrency"].get<int>(), r["tok_per_s"].get<double>(), r["min"].get<double>(),
                  r["max"].get<double>(), format_bytes(r["bytes_per_step"].get<double>()).c_str(),
                  100.0 * r["fraction_of_bandwidth"].get<double>(), cpu ? "memory" : "HBM",
                  r["ttft_p50_ms"].get<double>(), r["stream_decode_tok_per_s"].get<double>());
  if (out.contains("serving_structured"))
    for (size_t i = 0; i < out["serving_structured"].size(); ++i) {
      const auto& r = out["serving_structured"][i];
      std::printf("structured n=%-7d %10.1f/s %10.1f/s %10.1f/s   generated tokens, every request held to %s: "
                  "%.1f%% of the plain figure\n",
                  r["concurrency"].get<int>(), r["tok_per_s"].get<double>(), r["min"].get<double>(),
                  r["max"].get<double>(), a.json_schema.c_str(),
                  100.0 * r["tok_per_s"].get<double>() / out["serving"][i]["tok_per_s"].get<double>());
    }
  if (out.contains("arrivals")) print_arrivals(out["arrivals"]);
  if (a.breakdown) {
    print_op_rows("decode step", out["breakdown"]["decode"]);
    const std::string batch = "batched step of " + std::to_string(out["breakdown"]["batch_size"].get<int>());
    print_op_rows(batch.c_str(), out["breakdown"]["batch"]);
    const std::string title = "prefill of " + std::to_string(out["breakdown"]["prefill_tokens"].get<int>()) + " tokens";
    print_op_rows(title.c_str(), out["breakdown"]["prefill"]);
    if (out["breakdown"].contains("graphs"))
      for (const auto& g : out["breakdown"]["graphs"]) print_graph_kernels(g);
    if (out["breakdown"].contains("graph_error"))
      std::printf("\nkernels of the replayed graph: not measured (%s)\n",
                  out["breakdown"]["graph_error"].get<std::string>().c_str());
  }
}

void add(CLI::App& app) {
  static Args a;
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode throughput on the GPU or the CPU");
  add_model_dir(cmd, a.dir, "Checkpoint folder (or use --synthetic)", /*required=*/false);
  cmd->add_option("--synthetic", a.synthetic, "Random weights of a released shape (CUDA): qwen3.5-35b-a3b, "
                                              "qwen3-next-80b-a3b, qwen3-30b-a3b");
  cmd->add_option("--device", a.device, "auto (cuda when a GPU is present), cuda or cpu")->capture_default_str();
  add_threads_flag(cmd, a.threads);
  cmd->add_option("--weights", a.weights,
                  "CUDA: int4 (MLX affine, group 64; router 8-bit), bf16, fp8 (e4m3, 128x128 block scales, as "
                  "Qwen's FP8 releases), or with --synthetic a GGUF mix as llama.cpp quantises it: q4_0 or q4_k_m")
      ->capture_default_str();
  cmd->add_option("--prefill", a.prefill, std::string("Prompt lengths to time (CPU default ") + kCpuPrefill + ")")
      ->capture_default_str();
  cmd->add_option("--decode-context", a.contexts,
                  std::string("Context lengths before timed decode (CPU default ") + kCpuContexts + ")")
      ->capture_default_str();
  cmd->add_option("--decode-tokens", a.decode_tokens,
                  "Decode steps per run (CPU default " + std::to_string(kCpuDecodeTokens) + ")")
      ->capture_default_str();
  cmd->add_option("--runs", a.runs, "Timed runs per measurement (median reported)")->capture_default_str();
  cmd->add_option("--chunk", a.chunk, "Prefill chunk length")->capture_default_str();
  cmd->add_flag("!--no-cuda-graphs", a.graphs, "Launch decode kernels one by one instead of replaying a graph");
  cmd->add_flag("--json", a.json, "Machine-readable output");
  cmd->add_option("--concurrency", a.concurrency,
                  "Concurrent greedy requests through the continuous-batching scheduler, e.g. 1,8,32 "
                  "(128-token prompts, 128 tokens each; with --speculative mtp, as petrel serve --speculative mtp)");
  cmd->add_option("--serving-chunk", a.serving_chunk,
                  "Prompt tokens a serving step carries beside its decode rows (--concurrency, --arrivals)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--serving-burst", a.serving_burst,
                  "Prompt tokens a serving step reads while no stream decodes (--concurrency; as petrel serve "
                  "--prefill-burst)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--arrivals", a.arrival.prompt_tokens,
                  "With --concurrency: while the streams decode, a prompt of this many tokens arrives every "
                  "--arrival-every seconds; reports the streams' inter-token latency with and without, and the "
                  "arrivals' time to first token")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--arrival-every", a.arrival.every_s, "Seconds between two --arrivals")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--arrival-count", a.arrival.count, "Prompts that arrive per --arrivals run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--breakdown", a.breakdown,
                "Device time per op of one decode step and of the longest prefill (ops timed one by one), "
                "and a replayed decode step's kernels at each decode context");
  cmd->add_option("--breakdown-batch", a.breakdown_batch, "Sequences in the batched step --breakdown times")
      ->check(CLI::Range(2, 256))
      ->capture_default_str();
  cmd->add_option("--speculative", a.speculative,
                  "Decode through the generation loop plainly and with speculative decoding: mtp (the checkpoint's "
                  "draft head) or ngram (prompt lookup); acceptance rate and mean accepted length")
      ->check(CLI::IsMember({"ngram", "mtp"}));
  cmd->add_option("--draft-tokens", a.draft,
                  "--speculative: most tokens drafted per step (default " + std::to_string(kMtpDraft) + " for mtp, " +
                      std::to_string(kNgramDraft) + " for ngram)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--draft-accept-rate", a.accept_rate,
                  "--speculative: take each drafted token with this probability (up to the first refused) instead of "
                  "verifying it, for random weights whose drafts are never right; the device work is unchanged")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--json-schema", a.json_schema,
                  "With --concurrency: run it again with every request held to the JSON schema in FILE (structured "
                  "output) and report the throughput against the plain run")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", a.tokenizer,
                  "--json-schema on --synthetic weights: a folder with the tokenizer.json the grammar is compiled for");
  cmd->add_flag("--multi-turn", a.multi_turn,
                "Instead of the above: a chat resending its whole history each turn, through the scheduler with "
                "and without the prefix cache; time to first token per turn and the share of the history cached");
  cmd->add_option("--system-tokens", a.turns.system_tokens, "--multi-turn: the system prompt's length")
      ->capture_default_str();
  cmd->add_option("--turns", a.turns.turns, "--multi-turn: turns of the conversation")->capture_default_str();
  cmd->add_option("--final-tokens", a.turns.final_tokens, "--multi-turn: the last turn's prompt length")
      ->capture_default_str();
  cmd->add_option("--reply-tokens", a.turns.reply_tokens, "--multi-turn: tokens generated per turn")
      ->capture_default_str();
  cmd->add_option("--turn-gap-ms", a.turns.turn_gap_ms,
                  "--multi-turn: the user's pause between a reply and the next turn (the cache replays the reply "
                  "meanwhile; 0 sends the next turn at once)")
      ->capture_default_str();
  cmd->add_option_function<int>(
         "--prefix-cache-mb", [](int mb) { a.turns.cache_bytes = size_t(mb) << 20; },
         "--multi-turn: memory for prefix snapshots (default 4096, as petrel serve)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--prefix-cache-host-mb", a.cache_host_mb,
                  "--multi-turn: host memory for prefix snapshots pushed out of --prefix-cache-mb (default as petrel "
                  "serve: 8192 on CUDA, 0 on the CPU)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->callback([cmd] {
    a.weights_set = cmd->count("--weights") > 0;
    a.prefill_set = cmd->count("--prefill") > 0;
    a.contexts_set = cmd->count("--decode-context") > 0;
    a.decode_tokens_set = cmd->count("--decode-tokens") > 0;
    run(a);
  });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
