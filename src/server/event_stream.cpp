#include "server/event_stream.h"

#include "server/request_log.h"
#include "server/sse.h"

namespace petrel::server {
namespace {

// How long a provider call waits for tokens before writing a keep-alive comment instead; the
// write is what notices a client that left while its request waits or prefills.
constexpr std::chrono::milliseconds kKeepAlive{1000};

bool write(http::StreamSink& sink, const std::string& text) { return sink.write(text); }

}  // namespace

EventStream::EventStream(ServerState& state, Submission submission, std::unique_ptr<ResponseBuilder> builder,
                         bool include_usage, std::unique_ptr<ServerState::InFlight> in_flight)
    : state_(state),
      submission_(std::move(submission)),
      builder_(std::move(builder)),
      include_usage_(include_usage),
      in_flight_(std::move(in_flight)) {}

void EventStream::attach(std::shared_ptr<EventStream> stream, http::Response& res) {
  res.status = 200;
  res.content_type = "text/event-stream";
  res.set_header("Cache-Control", "no-cache");
  res.stream = [stream](http::StreamSink& sink) { return stream->write_next(sink); };
  res.stream_ended = [stream](bool complete) { stream->release(complete); };
  res.log_note = [stream] { return token_note(stream->submission_.prompt_tokens, stream->completion_tokens_); };
}

bool EventStream::write_next(http::StreamSink& sink) {
  JobUpdate update = submission_.job->next(kKeepAlive);
  const bool news = !update.delta.empty() || !update.logprobs.empty() || update.finish;
  if (!news) return write(sink, sse_comment());
  const std::optional<ApiError> error = update.finish ? finish_error(*update.finish) : std::nullopt;
  if (!error)
    for (const json& chunk : builder_->chunks(update, include_usage_))
      if (!write(sink, sse_event(chunk))) return false;
  if (!update.finish) return true;
  finished_ = true;
  completion_tokens_ = update.finish->completion_tokens;
  state_.metrics().count_finished(*update.finish);
  if (!error || write(sink, sse_event(error->body()))) write_end(sink, *update.finish);
  return false;
}

void EventStream::write_end(http::StreamSink& sink, const JobFinish& finish) {
  if (include_usage_ && !write(sink, sse_event(builder_->usage_chunk(submission_.prompt_tokens, finish.completion_tokens, finish.cached_tokens))))
    return;
  write(sink, sse_done());
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
