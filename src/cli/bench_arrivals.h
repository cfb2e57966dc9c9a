// `petrel bench --concurrency N --arrivals TOKENS`: N greedy streams decode through the
// continuous-batching scheduler while a new TOKENS-token prompt arrives every --arrival-every
// seconds. Reports the streams' inter-token latency (p50, p99) over a quiet window and over the
// window with arrivals, and the arrivals' time to first token: what a long prompt costs the
// streams already running.
#pragma once
#include <nlohmann/json.hpp>

#include "runtime/forward.h"

namespace petrel::cli {

struct ArrivalOptions {
  int prompt_tokens = 8192;  // each arrival's prompt
  double every_s = 1.0;      // between two arrivals; the quiet window lasts as long as the arrivals
  int count = 5;             // arrivals per run
  int prefill_chunk = 512;   // prompt tokens a step carries (SchedulerOptions::prefill_chunk)
};

// Throws petrel::Error naming the option when one is out of range or the model cannot hold it.
void check_arrivals(const ArrivalOptions& o, const Model& model);
// One run for `streams` decoding streams: latencies in milliseconds, p50 and p99 of each window.
nlohmann::json serving_with_arrivals(Model& model, int streams, const ArrivalOptions& o);
void print_arrivals(const nlohmann::json& rows);

}  // namespace petrel::cli
