// The server's phases over HTTP, in process: while the model loads only /health (503) and
// /metrics answer; once ready everything does; while draining new work gets 503.
#include <gtest/gtest.h>

#include "server/http_server.h"
#include "http_client.h"

namespace petrel::server {
namespace {

struct Running {
  ServerState state;
  HttpServer http{state, options()};

  Running() { http.start(); }

  static HttpOptions options() {
    HttpOptions o;
    o.port = 0;
    o.threads = 4;
    return o;
  }

  std::unique_ptr<ServedModel> tiny() {
    ServeOptions o;
    o.dir = std::string(PETREL_SOURCE_DIR) + "/models/petrel-tiny";
    o.load.threads = 1;
    o.load.progress = false;
    o.scheduler.max_sequences = 2;
    o.scheduler.context = 256;
    return std::make_unique<ServedModel>(o);
  }

  // Status and the error code (or the health status) of the answer.
  std::pair<int, std::string> get(const std::string& path) { return answer(test::http_request(http.port(), "GET", path)); }
  std::pair<int, std::string> post(const std::string& path, const std::string& body) {
    return answer(test::http_request(http.port(), "POST", path, body));
  }

  static std::pair<int, std::string> answer(const test::HttpAnswer& r) {
    if (r.status < 0) return {-1, "no answer"};
    const json body = json::parse(r.body, nullptr, false);
    if (body.contains("error")) return {r.status, body["error"]["code"].get<std::string>()};
    return {r.status, body.value("status", std::string())};
  }
};

const std::string kChat = R"({"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 40})";

TEST(HttpPhases, LoadingThenReadyThenDraining) {
  Running s;
  EXPECT_EQ(s.get("/health"), std::make_pair(503, std::string("loading")));
  EXPECT_EQ(s.post("/v1/chat/completions", kChat), std::make_pair(503, std::string("loading")));
  EXPECT_EQ(s.get("/v1/models"), std::make_pair(503, std::string("loading")));
  const auto metrics = test::http_request(s.http.port(), "GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("petrel_slots_in_use 0\n"), std::string::npos);

  s.state.set_ready(s.tiny());
  EXPECT_EQ(s.get("/health"), std::make_pair(200, std::string("ok")));
  const auto chat = test::http_request(s.http.port(), "POST", "/v1/chat/completions", kChat);
  EXPECT_EQ(chat.status, 200);
  EXPECT_EQ(json::parse(chat.body)["choices"][0]["message"]["content"], "Digits from the right: 4\nAnswer: 4");

  s.state.begin_draining();
  EXPECT_EQ(s.get("/health"), std::make_pair(503, std::string("shutting down")));
  EXPECT_EQ(s.post("/v1/completions", R"({"prompt": "x"})"), std::make_pair(503, std::string("shutting_down")));
  EXPECT_TRUE(s.state.wait_idle(std::chrono::milliseconds(0)));
  s.http.stop();
}

TEST(HttpPhases, AnAddressInUseIsAnErrorNamingIt) {
  Running first;
  HttpOptions same = Running::options();
  same.port = first.http.port();
  ServerState state;
  HttpServer second(state, same);
  try {
    second.start();
    FAIL() << "bound twice";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(same.port)), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace petrel::server
