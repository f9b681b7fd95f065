// One response's state, shared by the two parts that serve it: the session (the plan, the
// failover loop, the end) and the attempt driver (one endpoint at a time). Values, and the two
// duties both parts perform; every decision is in those parts, not here.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "gateway/protocol/response_builder.h"
#include "gateway/protocol/response_sink.h"
#include "gateway/request/profile_session.h"
#include "gateway/request/request_context.h"
#include "gateway/request/request_plan.h"
#include "gateway/request/request_record.h"
#include "gateway/snapshot.h"

namespace pulse::gateway {

struct ResponseState {
    ResponseState(RequestContext& gw, server::Exchange& ex);

    RequestContext& gw;
    server::Exchange& ex;
    const std::shared_ptr<const Snapshot> snap;  // the config generation this request uses, to its end
    const config::Config& cfg;
    const std::string id;
    const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

    RequestPlan req;                           // what the request asks for; its strings point into ex.body()
    std::unique_ptr<ProfileSession> profile;   // the profile's side (once translated)
    std::unique_ptr<ResponseBuilder> builder;  // the Responses events (once translated)
    ResponseSink sink;
    std::optional<BudgetReport> budget;           // the request's reasoning budget, if any, and how it is applied
    std::shared_ptr<RequestBoard::Entry> entry;  // what the status page shows of this request

    // What happened so far.
    Outcome outcome = Outcome::none;
    pulse_status_t last_status = PULSE_E_UNAVAILABLE;
    std::string last_error = "no endpoint configured";
    std::map<std::string, std::string> failures;  // endpoint name -> how it last failed this request
    bool misconfigured = false;                   // given up because every endpoint is misconfigured
    int retry_after_s = 0;  // the longest Retry-After a backend asked for
    std::string served_by;  // the endpoint that accepted it last
    std::optional<std::chrono::milliseconds> ttft;
    int resumes = 0;

    std::chrono::milliseconds keepalive{10000};
    std::chrono::steady_clock::time_point last_event = std::chrono::steady_clock::now();
    bool relaying = false;  // the stream loop sends this response's bytes now

    // Sends what is queued to the client, unless the stream loop is the one sending now.
    void flush();
    // A response.in_progress event when the stream has been quiet for the keepalive interval.
    void keepalive_if_due();
    // Fails the request as the profile said (`rc`, with the profile's message). False.
    bool refused_by_profile(pulse_status_t rc);
};

}  // namespace pulse::gateway
