#include "gateway/request/response_state.h"

#include <random>

#include "common/log.h"
#include "common/metrics.h"
#include "gateway/protocol/status_errors.h"

namespace pulse::gateway {

using namespace std::chrono;

namespace {

std::string new_response_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char* hex = "0123456789abcdef";
    std::string s = "resp_";
    for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
    return s;
}

}  // namespace

ResponseState::ResponseState(RequestContext& gw, server::Exchange& ex)
    : gw(gw), ex(ex), snap(gw.snapshot()), cfg(snap->cfg), id(new_response_id()), sink(ex) {}

void ResponseState::flush() {
    if (!relaying && !sink.lost()) sink.flush();
}

void ResponseState::keepalive_if_due() {
    if (!req.streaming || steady_clock::now() - last_event < keepalive) return;
    builder->keepalive();
    entry->keepalive();
    flush();
    metrics::global().counter("pulse_keepalives_total", "response.in_progress keepalive events sent", {{"model", req.model_id}}).add();
}

bool ResponseState::refused_by_profile(pulse_status_t rc) {
    last_status = rc;
    last_error = profile->error(rc);
    if (status_error(rc).http_status >= 500) log::error("responses", id + ": " + last_error);
    outcome = Outcome::rejected;
    return false;
}

}  // namespace pulse::gateway
