// What the route handlers share: JSON responses, error responses, the readiness check.
#include "core/error.h"
#include "server/routes.h"

namespace petrel::server {

void send_json(http::Response& res, int status, const json& body) {
  res.status = status;
  res.content_type = "application/json";
  res.body = dump(body);
}

void send_error(http::Response& res, const ApiError& error) { send_json(res, error.status(), error.body()); }

http::Handler guarded(http::Handler handler) {
  return [handler = std::move(handler)](const http::Request& req, http::Response& res) {
    try {
      handler(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(400, e.what()));
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
    }
  };
}

ServedModel& ready_model(const ServerState& state) {
  switch (state.phase()) {
    case Phase::Loading: throw ApiError(503, "the model is still loading; /health says when it is ready", "", "loading");
    case Phase::Draining: throw ApiError(503, "the server is shutting down", "", "shutting_down");
    case Phase::Ready: break;
  }
  return *state.model();
}

}  // namespace petrel::server
