#include "server/event_stream.h"

#include "server/sse.h"

namespace petrel::server {
namespace {

// How long a provider call waits for tokens before writing a keep-alive comment instead; the
// write is what notices a client that left while its request waits or prefills.
constexpr std::chrono::milliseconds kKeepAlive{1000};

bool write(httplib::DataSink& sink, const std::string& text) { return sink.write(text.data(), text.size()); }

}  // namespace

EventStream::EventStream(ServerState& state, Submission submission, std::unique_ptr<ResponseBuilder> builder,
                         bool include_usage, std::unique_ptr<ServerState::InFlight> in_flight)
    : state_(state),
      submission_(std::move(submission)),
      builder_(std::move(builder)),
      include_usage_(include_usage),
      in_flight_(std::move(in_flight)) {}

void EventStream::attach(std::shared_ptr<EventStream> stream, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [stream](size_t, httplib::DataSink& sink) { return stream->write_next(sink); },
      [stream](bool complete) { stream->release(complete); });
}

bool EventStream::write_next(httplib::DataSink& sink) {
  JobUpdate update = submission_.job->next(kKeepAlive);
  const bool news = !update.delta.empty() || !update.logprobs.empty() || update.finish;
  if (!news) return write(sink, sse_comment());
  const std::optional<ApiError> error = update.finish ? finish_error(*update.finish) : std::nullopt;
  if (!error)
    for (const json& chunk : builder_->chunks(update, include_usage_))
      if (!write(sink, sse_event(chunk))) return false;
  if (!update.finish) return true;
  finished_ = true;
  state_.metrics().count_finished(*update.finish);
  if (error && !write(sink, sse_event(error->body()))) return false;
  return write_end(sink, *update.finish);
}

bool EventStream::write_end(httplib::DataSink& sink, const JobFinish& finish) {
  if (include_usage_ && !write(sink, sse_event(builder_->usage_chunk(submission_.prompt_tokens, finish.completion_tokens))))
    return false;
  if (!write(sink, sse_done())) return false;
  sink.done();
  return true;
}

void EventStream::release(bool complete) {
  if (!complete && !finished_) {
    submission_.job->close();
    if (ServedModel* model = state_.model()) model->scheduler().cancel(submission_.id);
    JobFinish gone;
    gone.reason = FinishReason::Cancelled;
    state_.metrics().count_finished(gone);
  }
  in_flight_.reset();
}

}  // namespace petrel::server
