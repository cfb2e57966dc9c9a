// `petrel serve`'s request log: one line per request answered, safe whatever the client sent.
#include <gtest/gtest.h>

#include "server/request_log.h"

namespace petrel::server {
namespace {

using namespace std::chrono_literals;

// 2026-12-06T05:42:13.123Z
const std::chrono::system_clock::time_point kNow{1796535733123ms};

TEST(RequestLog, OneLineWithTimeMethodPathStatusTokensDurationAndClient) {
  http::Exchange e{"POST", "/v1/chat/completions", "127.0.0.1:50412", 200, 812400us, token_note(23, 21)};
  EXPECT_EQ(request_log_line(e, kNow),
            "2026-12-06T05:42:13.123Z POST /v1/chat/completions 200 prompt_tokens=23 completion_tokens=21 "
            "duration_ms=812.4 client=127.0.0.1:50412");
}

TEST(RequestLog, ARefusalBeforeTheRequestLineHasDashes) {
  http::Exchange e{"", "", "[::1]:7", 503, {}, ""};
  EXPECT_EQ(request_log_line(e, kNow), "2026-12-06T05:42:13.123Z - - 503 duration_ms=0.0 client=[::1]:7");
}

TEST(RequestLog, ControlBytesAndLongPathsCannotForgeLines) {
  http::Exchange e{"GET", "/a\nforged 200\r" + std::string(300, 'x'), "127.0.0.1:1", 404, 1ms, ""};
  const std::string line = request_log_line(e, kNow);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.find('\r'), std::string::npos) << line;
  EXPECT_NE(line.find(" GET /a?forged 200?xxx"), std::string::npos) << line;
  EXPECT_NE(line.find("xxx... 404 duration_ms=1.0"), std::string::npos) << line;
}

TEST(RequestLog, CompletionTokensUnknownAreLeftOut) {
  EXPECT_EQ(token_note(23, -1), "prompt_tokens=23");
  EXPECT_EQ(token_note(23, 0), "prompt_tokens=23 completion_tokens=0");
}

}  // namespace
}  // namespace petrel::server
