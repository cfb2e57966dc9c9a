// The HTTP request parser: framing, limits and refusals, whatever way the bytes are cut.
#include "server/http/request_parser.h"

#include <gtest/gtest.h>

namespace petrel::http {
namespace {

struct Parsed {
  RequestParser::State state;
  Request request;
  int status = 0;
  std::string message;
  size_t used = 0;
};

// Feeds `bytes` in pieces of `step` bytes (0: at once) until the parser stops taking them.
Parsed parse(const std::string& bytes, size_t step = 0, ParseLimits limits = {}) {
  RequestParser parser(limits);
  Parsed out;
  const size_t piece = step ? step : bytes.size();
  while (out.used < bytes.size()) {
    const size_t n = parser.feed(std::string_view(bytes).substr(out.used, piece));
    out.used += n;
    if (n == 0) break;
  }
  out.state = parser.state();
  out.request = parser.request();
  out.status = parser.error_status();
  out.message = parser.error_message();
  return out;
}

const std::string kPost = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                          "Content-Length: 13\r\n\r\n{\"prompt\":\"\"}";

TEST(RequestParser, ReadsAPostWholeOrAByteAtATime) {
  for (size_t step : {0, 1, 7}) {
    const Parsed p = parse(kPost, step);
    ASSERT_EQ(p.state, RequestParser::State::Done) << step << ": " << p.message;
    EXPECT_EQ(p.request.method, "POST");
    EXPECT_EQ(p.request.path, "/v1/completions");
    EXPECT_EQ(p.request.query, "x=1");
    EXPECT_EQ(p.request.body, "{\"prompt\":\"\"}");
    EXPECT_EQ(p.request.header_or_empty("content-type"), "application/json");
    EXPECT_EQ(p.used, kPost.size());
  }
}

TEST(RequestParser, LeavesAPipelinedRequestUnread) {
  const std::string next = "GET /health HTTP/1.1\r\n\r\n";
  const Parsed p = parse(kPost + next);
  EXPECT_EQ(p.state, RequestParser::State::Done);
  EXPECT_EQ(p.used, kPost.size());
}

TEST(RequestParser, DecodesAChunkedBodyWithExtensionsAndTrailers) {
  const std::string chunked = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "5;ext=1\r\nhello\r\nA\r\n, chunked!\r\n0\r\nX-Trailer: t\r\n\r\n";
  for (size_t step : {0, 1, 3}) {
    const Parsed p = parse(chunked, step);
    ASSERT_EQ(p.state, RequestParser::State::Done) << p.message;
    EXPECT_EQ(p.request.body, "hello, chunked!");
    EXPECT_EQ(p.request.header("x-trailer"), nullptr);  // trailers are read past, not kept
  }
}

TEST(RequestParser, BareLineFeedsAndLeadingEmptyLinesAreAccepted) {
  const Parsed p = parse("\r\n\nGET /health HTTP/1.0\nConnection: keep-alive\n\n");
  ASSERT_EQ(p.state, RequestParser::State::Done) << p.message;
  EXPECT_EQ(p.request.minor_version, 0);
  EXPECT_EQ(p.request.header_or_empty("connection"), "keep-alive");
}

TEST(RequestParser, BodiesOverTheLimitAreRefusedBeforeOrWhileTheyArrive) {
  ParseLimits limits;
  limits.max_body_bytes = 10;
  const Parsed declared = parse("POST /x HTTP/1.1\r\nContent-Length: 11\r\n\r\n", 0, limits);
  EXPECT_EQ(declared.status, 413);
  EXPECT_NE(declared.message.find("11 bytes; the limit is 10"), std::string::npos) << declared.message;
  const Parsed chunked = parse("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n3\r\n", 1, limits);
  EXPECT_EQ(chunked.status, 413);
}

TEST(RequestParser, HeadsOverTheLimitsGet431) {
  ParseLimits limits;
  limits.max_headers = 3;
  limits.max_head_bytes = 200;
  EXPECT_EQ(parse("GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\n\r\n", 0, limits).status, 431);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n", 0, limits).state, RequestParser::State::Done);
  const std::string big = "GET / HTTP/1.1\r\nx: " + std::string(300, 'a');  // no end in sight: refused early
  EXPECT_EQ(parse(big, 16, limits).status, 431);
}

TEST(RequestParser, CompressedBodiesAndOtherCodingsAreRefused) {
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx").status, 415);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Encoding: identity, br\r\n\r\n").status, 415);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Encoding: identity\r\nContent-Length: 1\r\n\r\nx").state,
            RequestParser::State::Done);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").status, 501);
}

TEST(RequestParser, AmbiguousFramingsAreRefused) {
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n").status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n").status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n").status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n").status, 400);
}

TEST(RequestParser, MalformedHeadsAreRefusedNamingWhatWasFound) {
  const Parsed line = parse("GET /\r\n\r\n");
  EXPECT_EQ(line.status, 400);
  EXPECT_NE(line.message.find("\"GET /\""), std::string::npos) << line.message;
  EXPECT_EQ(parse("GET / HTTP/2.0\r\n\r\n").status, 505);
  EXPECT_EQ(parse("GET nope HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n").status, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\na: 1\r\n folded\r\n\r\n").status, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\na: x\x01y\r\n\r\n").status, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nExpect: something\r\n\r\n").status, 417);
}

TEST(RequestParser, ExpectContinueIsReportedUntilTheBodyBegins) {
  RequestParser parser{ParseLimits{}};
  parser.feed("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_TRUE(parser.wants_continue());
  parser.feed("a");
  EXPECT_FALSE(parser.wants_continue());
  parser.feed("b");
  EXPECT_EQ(parser.state(), RequestParser::State::Done);
  parser.reset();
  EXPECT_EQ(parser.state(), RequestParser::State::Head);
  EXPECT_EQ(parser.bytes_seen(), 0u);
}

}  // namespace
}  // namespace petrel::http
