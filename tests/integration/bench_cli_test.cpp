// `petrel bench --device cpu` as a person runs it on the bundled petrel-tiny model: the JSON
// figures, the multi-turn chat with and without the prefix cache (and with its host budget), and
// the refusals of what only the CUDA backend measures or what cannot be laid out.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "../unit/test_util.h"
#include "io/checkpoint.h"

namespace petrel {
namespace {

const std::string kTiny = test::tiny_model_dir();

// A row of `runs` timed runs: min, median and max of its per-run figures.
void expect_timed(const nlohmann::json& row, size_t runs) {
  EXPECT_GT(row["tok_per_s"].get<double>(), 0.0) << row;
  EXPECT_LE(row["min"].get<double>(), row["tok_per_s"].get<double>()) << row;
  EXPECT_LE(row["tok_per_s"].get<double>(), row["max"].get<double>()) << row;
  const auto each = row["runs_tok_per_s"].get<std::vector<double>>();
  ASSERT_EQ(each.size(), runs) << row;
  EXPECT_EQ(*std::min_element(each.begin(), each.end()), row["min"].get<double>()) << row;
  EXPECT_EQ(*std::max_element(each.begin(), each.end()), row["max"].get<double>()) << row;
  int below = 0, above = 0;
  for (double v : each) {
    below += v < row["tok_per_s"].get<double>();
    above += v > row["tok_per_s"].get<double>();
  }
  EXPECT_LE(below, int(runs / 2)) << row;
  EXPECT_LE(above, int(runs / 2)) << row;
}

TEST(BenchCli, CpuPrefillAndDecodeFigures) {
  const test::CliResult r = test::run_petrel("bench -m " + kTiny +
                                                 " --device cpu -t 2 --prefill 16,32 --decode-context 0,24 "
                                                 "--decode-tokens 4 --runs 3 --json",
                                             "2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json d = nlohmann::json::parse(r.out);
  EXPECT_EQ(d["device"], "CPU, 2 threads");
  EXPECT_EQ(d["weights"], "as stored");
  EXPECT_EQ(d["cuda_graphs"], false);
  EXPECT_GT(d["memory_copy_bandwidth_GBps"].get<double>(), 0.0);
  ASSERT_EQ(d["prefill"].size(), 2u);
  EXPECT_EQ(d["prefill"][0]["tokens"], 16);
  EXPECT_EQ(d["prefill"][1]["tokens"], 32);
  for (const auto& p : d["prefill"]) expect_timed(p, 3);
  ASSERT_EQ(d["decode"].size(), 2u);
  EXPECT_EQ(d["decode"][0]["context"], 0);
  EXPECT_EQ(d["decode"][1]["context"], 24);
  for (const auto& q : d["decode"]) {
    expect_timed(q, 3);
    EXPECT_GT(q["fraction_of_bandwidth"].get<double>(), 0.0) << q;
  }
  // 24 more keys and values in fp32 (the CPU's KV cache) for each attention layer.
  const ModelConfig c = Checkpoint::open(kTiny)->config();
  int attention_layers = 0;
  for (LayerKind k : c.layer_kinds) attention_layers += k == LayerKind::FullAttention;
  ASSERT_GT(attention_layers, 0);
  const double kv = 2.0 * 4.0 * 24 * c.n_kv_heads * c.head_dim * attention_layers;
  EXPECT_DOUBLE_EQ(d["decode"][1]["bytes_per_token"].get<double>() - d["decode"][0]["bytes_per_token"].get<double>(),
                   kv);
}

// Serving figures with their share of the bandwidth bound, each request's time to first token
// and its rate after it, and streams decoding while prompts arrive: both windows' inter-token
// latencies and the arrivals' times to first token.
TEST(BenchCli, CpuServingWithArrivals) {
  const test::CliResult r = test::run_petrel("bench -m " + kTiny +
                                                 " --device cpu -t 2 --prefill 16 --decode-context 0 --decode-tokens 2 "
                                                 "--runs 1 --concurrency 2 --serving-chunk 64 --arrivals 200 "
                                                 "--arrival-every 0.3 --arrival-count 2 --json",
                                             "2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json d = nlohmann::json::parse(r.out);
  ASSERT_EQ(d["serving"].size(), 1u);
  expect_timed(d["serving"][0], 1);
  EXPECT_GT(d["serving"][0]["bytes_per_step"].get<double>(), 0.0);
  EXPECT_GT(d["serving"][0]["fraction_of_bandwidth"].get<double>(), 0.0);
  EXPECT_GT(d["serving"][0]["ttft_p50_ms"].get<double>(), 0.0);
  EXPECT_GT(d["serving"][0]["stream_decode_tok_per_s"].get<double>(), 0.0);
  ASSERT_EQ(d["arrivals"].size(), 1u);
  const nlohmann::json& a = d["arrivals"][0];
  EXPECT_EQ(a["streams"], 2);
  EXPECT_EQ(a["arrivals"], 2);
  EXPECT_EQ(a["arrival_tokens"], 200);
  for (const char* w : {"quiet", "with_arrivals"}) {
    EXPECT_GT(a[w]["itl_p50_ms"].get<double>(), 0.0) << a;
    EXPECT_GE(a[w]["itl_p99_ms"].get<double>(), a[w]["itl_p50_ms"].get<double>()) << a;
    EXPECT_GT(a[w]["tok_per_s"].get<double>(), 0.0) << a;
  }
  EXPECT_GT(a["ttft_p50_ms"].get<double>(), 0.0) << a;
  EXPECT_GE(a["ttft_p99_ms"].get<double>(), a["ttft_p50_ms"].get<double>()) << a;
  const test::CliResult alone = test::run_petrel("bench -m " + kTiny + " --device cpu --arrivals 200", "2>&1");
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(alone.out.find("--arrivals needs --concurrency"), std::string::npos) << alone.out;
}

// --json-schema repeats the serving run with every request held to the schema: both runs are
// timed, and the flag is refused without --concurrency or with --tokenizer alone.
TEST(BenchCli, CpuServingWithStructuredOutput) {
  const std::string schema = std::string(PETREL_FIXTURES_DIR) + "/schemas/record.json";
  const test::CliResult r = test::run_petrel("bench -m " + kTiny +
                                                 " --device cpu -t 2 --prefill 16 --decode-context 0 --decode-tokens 2 "
                                                 "--runs 1 --concurrency 2 --json --json-schema " + schema,
                                             "2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json d = nlohmann::json::parse(r.out);
  ASSERT_EQ(d["serving"].size(), 1u);
  ASSERT_EQ(d["serving_structured"].size(), 1u);
  expect_timed(d["serving_structured"][0], 1);
  EXPECT_EQ(d["serving_structured"][0]["concurrency"], 2);
  const test::CliResult alone = test::run_petrel("bench -m " + kTiny + " --device cpu --json-schema " + schema, "2>&1");
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(alone.out.find("--json-schema needs --concurrency"), std::string::npos) << alone.out;
  const test::CliResult tok = test::run_petrel("bench -m " + kTiny + " --device cpu --tokenizer " + kTiny, "2>&1");
  EXPECT_EQ(tok.status, 1);
  EXPECT_NE(tok.out.find("--tokenizer: only with --json-schema"), std::string::npos) << tok.out;
}

TEST(BenchCli, CpuRefusesWhatOnlyCudaMeasures) {
  const test::CliResult synthetic = test::run_petrel("bench --synthetic qwen3.5-35b-a3b --device cpu", "2>&1");
  EXPECT_EQ(synthetic.status, 1);
  EXPECT_NE(synthetic.out.find("on the CPU give a checkpoint DIR"), std::string::npos) << synthetic.out;
  const test::CliResult weights = test::run_petrel("bench " + kTiny + " --device cpu --weights int4", "2>&1");
  EXPECT_EQ(weights.status, 1);
  EXPECT_NE(weights.out.find("--weights applies to --device cuda"), std::string::npos) << weights.out;
  const test::CliResult breakdown = test::run_petrel("bench " + kTiny + " --device cpu --breakdown", "2>&1");
  EXPECT_EQ(breakdown.status, 1);
  EXPECT_NE(breakdown.out.find("--breakdown times the CUDA backend's kernels"), std::string::npos) << breakdown.out;
  const test::CliResult device = test::run_petrel("bench " + kTiny + " --device gpu", "2>&1");
  EXPECT_EQ(device.status, 1);
  EXPECT_NE(device.out.find("--device 'gpu' is not known (expected auto, cuda or cpu)"), std::string::npos)
      << device.out;
}

// Turns of 256, 384 and 512 tokens with 8-token replies: each later turn restores its
// predecessor's prompt (a whole number of 64-token blocks) out of the history it resends.
TEST(BenchCli, CpuMultiTurnRestoresEachTurnsHistory) {
  const test::CliResult r = test::run_petrel("bench " + kTiny +
                                                 " --device cpu -t 2 --multi-turn --system-tokens 128 --turns 3 "
                                                 "--final-tokens 512 --reply-tokens 8 --runs 3 --turn-gap-ms 20 --json",
                                             "2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json d = nlohmann::json::parse(r.out);
  EXPECT_FALSE(d.contains("prefill"));
  EXPECT_FALSE(d.contains("decode"));
  const nlohmann::json& m = d["multi_turn"];
  EXPECT_EQ(m["same_replies"], true);
  EXPECT_EQ(m["turn_gap_ms"], 20);
  ASSERT_EQ(m["rows"].size(), 3u);
  const int prompt[] = {256, 384, 512}, shared[] = {0, 264, 392}, cached[] = {0, 256, 384};
  for (size_t t = 0; t < 3; ++t) {
    const nlohmann::json& row = m["rows"][t];
    EXPECT_EQ(row["turn"], int(t) + 1);
    EXPECT_EQ(row["prompt_tokens"], prompt[t]) << row;
    EXPECT_EQ(row["shared_prefix_tokens"], shared[t]) << row;
    EXPECT_EQ(row["cached_tokens"], cached[t]) << row;
    for (const char* mode : {"ttft_cached_ms", "ttft_uncached_ms"}) {
      const nlohmann::json& ttft = row[mode];
      EXPECT_EQ(ttft["runs"].size(), 3u) << row;
      EXPECT_GT(ttft["min"].get<double>(), 0.0) << row;
      EXPECT_LE(ttft["min"].get<double>(), ttft["median"].get<double>()) << row;
      EXPECT_LE(ttft["median"].get<double>(), ttft["max"].get<double>()) << row;
    }
    EXPECT_DOUBLE_EQ(row["ttft_ratio"].get<double>(),
                     row["ttft_cached_ms"]["median"].get<double>() / row["ttft_uncached_ms"]["median"].get<double>());
  }
  EXPECT_TRUE(m["rows"][0]["cached_share"].is_null());
  EXPECT_DOUBLE_EQ(m["rows"][1]["cached_share"].get<double>(), 256.0 / 264.0);
  EXPECT_DOUBLE_EQ(m["rows"][2]["cached_share"].get<double>(), 384.0 / 392.0);
  EXPECT_EQ(m["prefix_cache_host_bytes"], 0) << "the CPU's default: its snapshots are in host memory already";
}

// The same chat under a device budget of 1 MiB, which holds one of its snapshots (the 256-token
// one takes 0.7 MB, the 384-token one 0.9 MB): turn 2's snapshot spills turn 1's to the host
// budget, and the answers and restores do not change.
TEST(BenchCli, CpuMultiTurnSpillsToTheHostBudget) {
  const test::CliResult r = test::run_petrel("bench " + kTiny +
                                                 " --device cpu -t 2 --multi-turn --system-tokens 128 --turns 3 "
                                                 "--final-tokens 512 --reply-tokens 8 --runs 1 --prefix-cache-mb 1 "
                                                 "--prefix-cache-host-mb 16 --json",
                                             "2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json m = nlohmann::json::parse(r.out)["multi_turn"];
  EXPECT_EQ(m["same_replies"], true);
  EXPECT_EQ(m["prefix_cache_host_bytes"], 16 << 20);
  EXPECT_EQ(m["rows"][1]["cached_tokens"], 256) << m;
  EXPECT_EQ(m["rows"][2]["cached_tokens"], 384) << m;
  const nlohmann::json& c = m["cache_at_end"];
  EXPECT_EQ(c["spills"], 1) << c;
  EXPECT_EQ(c["host_entries"], 1) << c;
  EXPECT_EQ(c["entries"], 1) << c;
  EXPECT_EQ(c["evictions"], 0) << c;
}

TEST(BenchCli, MultiTurnRefusesWhatCannotBeLaidOut) {
  const test::CliResult defaults = test::run_petrel("bench " + kTiny + " --device cpu --multi-turn", "2>&1");
  EXPECT_EQ(defaults.status, 1);
  EXPECT_NE(defaults.out.find("--final-tokens: the last turn (16384 prompt + 128 reply tokens) exceeds the model's "
                              "2048 positions"),
            std::string::npos)
      << defaults.out;
  const test::CliResult reply = test::run_petrel(
      "bench " + kTiny + " --device cpu --multi-turn --system-tokens 128 --turns 3 --final-tokens 512 --reply-tokens 128",
      "2>&1");
  EXPECT_EQ(reply.status, 1);
  EXPECT_NE(reply.out.find("--reply-tokens: expected fewer than each turn's growth ((--final-tokens - "
                           "--system-tokens) / --turns = 128 tokens), found 128"),
            std::string::npos)
      << reply.out;
  const test::CliResult gap = test::run_petrel(
      "bench " + kTiny + " --device cpu --multi-turn --system-tokens 128 --turns 3 --final-tokens 512 --turn-gap-ms -5",
      "2>&1");
  EXPECT_EQ(gap.status, 1);
  EXPECT_NE(gap.out.find("--turn-gap-ms: expected >= 0, found -5"), std::string::npos) << gap.out;
  const test::CliResult mixed = test::run_petrel("bench " + kTiny + " --device cpu --multi-turn --prefill 16", "2>&1");
  EXPECT_EQ(mixed.status, 1);
  EXPECT_NE(mixed.out.find("--multi-turn runs on its own"), std::string::npos) << mixed.out;
}

// Speculative decode on the MTP fixture: forced acceptance of every draft, then of none, each
// beside plain decoding through the same loop, with the drafts' totals in the JSON.
TEST(BenchCli, CpuSpeculativeMtpWithForcedAcceptance) {
  const std::string mtp = test::fixture_model("qwen35moe-mtp");
  for (double rate : {1.0, 0.0}) {
    SCOPED_TRACE("rate " + std::to_string(rate));
    const test::CliResult r = test::run_petrel("bench " + mtp +
                                                   " --device cpu -t 1 --prefill 16 --decode-context 0,24 "
                                                   "--decode-tokens 24 --runs 2 --speculative mtp --draft-tokens 2 "
                                                   "--draft-accept-rate " + std::to_string(rate) + " --json",
                                               "2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.out;
    const nlohmann::json d = nlohmann::json::parse(r.out);
    EXPECT_EQ(d["speculative"]["source"], "mtp");
    EXPECT_EQ(d["speculative"]["draft_tokens"], 2);
    EXPECT_EQ(d["speculative"]["forced_acceptance"].get<double>(), rate);
    EXPECT_FALSE(d.contains("decode"));
    ASSERT_EQ(d["speculative_decode"].size(), 2u);
    for (const auto& row : d["speculative_decode"]) {
      expect_timed(row["plain"], 2);
      expect_timed(row["speculative"], 2);
      const int drafted = row["drafted"].get<int>(), accepted = row["accepted"].get<int>();
      const int steps = row["verify_steps"].get<int>();
      ASSERT_GT(drafted, 0) << row;
      EXPECT_EQ(accepted, rate == 1.0 ? drafted : 0) << row;
      EXPECT_DOUBLE_EQ(row["acceptance_rate"].get<double>(), double(accepted) / drafted) << row;
      EXPECT_DOUBLE_EQ(row["mean_accepted_length"].get<double>(), double(accepted + steps) / steps) << row;
      // Every step drafts 2 when all are taken (the last may be cut by the token budget).
      if (rate == 1.0) {
        EXPECT_GT(row["mean_accepted_length"].get<double>(), 2.5) << row;
      }
      EXPECT_DOUBLE_EQ(row["speedup"].get<double>(), row["speculative"]["tok_per_s"].get<double>() /
                                                         row["plain"]["tok_per_s"].get<double>());
    }
  }
}

// Prompt lookup on a prompt that repeats a motif: every step finds a draft, all of it taken.
TEST(BenchCli, CpuSpeculativeNgramDraftsFromTheRepeatedPrompt) {
  const test::CliResult r = test::run_petrel("bench " + kTiny +
                                                 " --device cpu -t 1 --prefill 16 --decode-context 0 "
                                                 "--decode-tokens 16 --runs 2 --speculative ngram --draft-tokens 3 "
                                                 "--draft-accept-rate 1 --json",
                                             "2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json row = nlohmann::json::parse(r.out)["speculative_decode"][0];
  EXPECT_EQ(row["speculative"]["runs_tok_per_s"].size(), 2u) << row;
  EXPECT_GT(row["drafted"].get<int>(), 0) << row;
  EXPECT_EQ(row["accepted"], row["drafted"]) << row;
  EXPECT_GT(row["mean_accepted_length"].get<double>(), 3.0) << row;
}

TEST(BenchCli, SpeculativeRefusals) {
  const test::CliResult no_head = test::run_petrel("bench " + kTiny + " --device cpu --speculative mtp", "2>&1");
  EXPECT_EQ(no_head.status, 1);
  EXPECT_NE(no_head.out.find("--speculative mtp needs a checkpoint with a multi-token prediction head"),
            std::string::npos)
      << no_head.out;
  const test::CliResult alone = test::run_petrel("bench " + kTiny + " --device cpu --draft-accept-rate 0.5", "2>&1");
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(alone.out.find("--draft-tokens and --draft-accept-rate: only with --speculative"), std::string::npos)
      << alone.out;
  const test::CliResult range =
      test::run_petrel("bench " + kTiny + " --device cpu --speculative ngram --draft-accept-rate 2", "2>&1");
  EXPECT_NE(range.status, 0);
  EXPECT_NE(range.out.find("--draft-accept-rate: Value 2 not in range"), std::string::npos) << range.out;
}

}  // namespace
}  // namespace petrel
