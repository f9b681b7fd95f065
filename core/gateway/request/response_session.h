// POST /v1/responses: one request from receipt to the last byte (response_session.cpp).
#pragma once

#include "gateway/request/request_context.h"
#include "server/http_server.h"

namespace pulse::gateway {

// Serves the request on the calling (worker) thread; returns once the response has ended.
void serve_response(RequestContext& gw, server::Exchange& ex);

}  // namespace pulse::gateway
