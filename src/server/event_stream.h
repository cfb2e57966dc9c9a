// A streaming response: a submitted request's updates written to the client as server-sent
// events, one chunk of the response each. A write that fails (the client is gone) cancels the
// request, which frees its slot.
#pragma once

#include <memory>

#include "server/http/message.h"
#include "server/responses.h"
#include "server/server_state.h"
#include "server/submission.h"

namespace petrel::server {

class EventStream {
 public:
  EventStream(ServerState& state, Submission submission, std::unique_ptr<ResponseBuilder> builder,
              bool include_usage, std::unique_ptr<ServerState::InFlight> in_flight);

  // Installs this stream as `res`'s content.
  static void attach(std::shared_ptr<EventStream> stream, http::Response& res);

 private:
  // One call of the stream: waits briefly for news and writes it; false when the stream is over
  // (its end written, or the client gone).
  bool write_next(http::StreamSink& sink);
  void write_end(http::StreamSink& sink, const JobFinish& finish);
  // The stream is over; `complete` is false when it broke off before the end.
  void release(bool complete);

  ServerState& state_;
  Submission submission_;
  std::unique_ptr<ResponseBuilder> builder_;
  bool include_usage_;
  bool finished_ = false;
  int completion_tokens_ = -1;  // known once the request finished
  std::unique_ptr<ServerState::InFlight> in_flight_;
};

}  // namespace petrel::server
