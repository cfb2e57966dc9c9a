// A streaming response: a submitted request's updates written to the client as server-sent
// events through cpp-httplib's chunked content provider. A write that fails (the client is gone)
// cancels the request, which frees its slot.
#pragma once
#include <httplib.h>

#include <memory>

#include "server/responses.h"
#include "server/server_state.h"
#include "server/submission.h"

namespace petrel::server {

class EventStream {
 public:
  EventStream(ServerState& state, Submission submission, std::unique_ptr<ResponseBuilder> builder,
              bool include_usage, std::unique_ptr<ServerState::InFlight> in_flight);

  // Installs this stream as `res`'s content.
  static void attach(std::shared_ptr<EventStream> stream, httplib::Response& res);

 private:
  // One provider call: waits briefly for news and writes it; false when the client is gone.
  bool write_next(httplib::DataSink& sink);
  bool write_end(httplib::DataSink& sink, const JobFinish& finish);
  // The provider is done; `complete` is false when the stream broke off before the end.
  void release(bool complete);

  ServerState& state_;
  Submission submission_;
  std::unique_ptr<ResponseBuilder> builder_;
  bool include_usage_;
  bool finished_ = false;
  std::unique_ptr<ServerState::InFlight> in_flight_;
};

}  // namespace petrel::server
