#include "server/metrics.h"

#include <cstdio>
#include <set>

#include "server/responses.h"

namespace petrel::server {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string header(const std::string& name, const char* type, const char* help) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

std::string sample(const std::string& name, double value) { return name + " " + number(value) + "\n"; }

std::string route_label(const std::string& path) {
  static const std::set<std::string> routes = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                               "/metrics", "/tokenize", "/detokenize"};
  return routes.count(path) ? path : "other";
}

std::string finish_label(const JobFinish& f) {
  if (!f.error.empty()) return "error";
  if (f.reason == FinishReason::Cancelled) return "cancelled";
  return finish_reason_text(f);
}

std::string scheduler_lines(const SchedulerMetrics& s) {
  std::string out;
  const auto counter = [&](const char* name, const char* help, double v) {
    out += header(name, "counter", help) + sample(name, v);
  };
  const auto gauge = [&](const char* name, const char* help, double v) {
    out += header(name, "gauge", help) + sample(name, v);
  };
  counter("petrel_prompt_tokens_total", "Prompt tokens prefilled.", double(s.prompt_tokens));
  counter("petrel_generation_tokens_total", "Tokens generated.", double(s.generated_tokens));
  counter("petrel_decode_steps_total", "Batched decode steps run.", double(s.decode_steps));
  counter("petrel_prompt_steps_total", "Steps that read prompt tokens.", double(s.prompt_steps));
  counter("petrel_prompt_pieces_total", "Prompt pieces read; several prompts waiting together share a step.",
          double(s.prompt_pieces));
  counter("petrel_speculative_verify_steps_total", "Decode steps that verified a draft (serve --speculative).",
          double(s.verify_steps));
  counter("petrel_speculative_drafted_tokens_total", "Tokens drafted for verification.", double(s.drafted_tokens));
  counter("petrel_speculative_accepted_tokens_total", "Drafted tokens accepted.", double(s.accepted_tokens));
  gauge("petrel_sequences_running", "Sequences holding a slot.", s.running);
  gauge("petrel_sequences_queued", "Requests waiting for a slot.", s.queued);
  gauge("petrel_slots_total", "Sequence slots allocated.", s.slots_total);
  gauge("petrel_slots_in_use", "Sequence slots in use.", s.slots_in_use);
  gauge("petrel_kv_tokens_in_use", "Tokens held in the KV caches of slots in use.", double(s.kv_tokens_in_use));
  gauge("petrel_batch_size", "Sequences in the most recent decode step.", s.last_batch_size);
  const PrefixCacheStats& p = s.prefix_cache;
  counter("petrel_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", double(p.queried_tokens));
  counter("petrel_prefix_cache_hits_total", "Prompt tokens restored from the prefix cache.", double(p.hit_tokens));
  counter("petrel_prefix_cache_host_hits_total", "Prompt tokens restored from prefix snapshots in host memory.",
          double(p.host_hit_tokens));
  counter("petrel_prefix_cache_spills_total", "Prefix snapshots moved from the device to host memory.",
          double(p.spills));
  counter("petrel_prefix_cache_evictions_total", "Prefix snapshots evicted.", double(p.evictions));
  counter("petrel_prefix_cache_replay_tokens_total",
          "Tokens fed again to snapshot finished replies (in decode steps, or alone when none ran).",
          double(s.replay_tokens));
  counter("petrel_prefix_cache_replay_live_tokens_total",
          "Of those, the tokens fed while their reply was still being generated (a spare slot following it).",
          double(s.replay_tokens_live));
  gauge("petrel_prefix_cache_bytes", "Memory held by prefix snapshots.", double(p.bytes));
  gauge("petrel_prefix_cache_entries", "Prefix snapshots held.", p.entries);
  gauge("petrel_prefix_cache_host_bytes", "Host memory held by spilled prefix snapshots.", double(p.host_bytes));
  gauge("petrel_prefix_cache_host_entries", "Prefix snapshots held in host memory.", p.host_entries);
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  return out + sample(name + "_sum", sum_) + name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}) {}

void ServerMetrics::count_request(const std::string& path, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{route_label(path), status}];
}

void ServerMetrics::count_finished(const JobFinish& finish) {
  std::lock_guard lock(mutex_);
  ++finished_[finish_label(finish)];
  if (finish.completion_tokens > 0) ttft_.observe(finish.ttft_s);
  if (finish.completion_tokens > 1) tpot_.observe(finish.tpot_s);
}

std::string ServerMetrics::render(const SchedulerMetrics* scheduler) const {
  std::lock_guard lock(mutex_);
  std::string out = header("petrel_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, count] : requests_)
    out += "petrel_http_requests_total{route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(count) + "\n";
  out += header("petrel_requests_finished_total", "counter", "Generations ended, by finish reason.");
  for (const auto& [reason, count] : finished_)
    out += "petrel_requests_finished_total{reason=\"" + reason + "\"} " + std::to_string(count) + "\n";
  out += header("petrel_time_to_first_token_seconds", "histogram", "Time from submission to the first token.");
  out += ttft_.render("petrel_time_to_first_token_seconds");
  out += header("petrel_time_per_output_token_seconds", "histogram", "Mean time per token after the first, per request.");
  out += tpot_.render("petrel_time_per_output_token_seconds");
  return out + scheduler_lines(scheduler ? *scheduler : SchedulerMetrics{});
}

}  // namespace petrel::server
