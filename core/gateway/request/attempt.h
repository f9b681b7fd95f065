// One attempt of a response on one endpoint — the middle of the request path. The driver sends
// the request to an HTTP endpoint, or starts a backend plugin's stream, and the stream loop
// relays the answer either way while this thread sleeps; the driver turns each upstream event
// into what it does to the response: output for the client, a failure another endpoint may
// repair (failover before any output, resume after), or the end.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "gateway/request/attempt_recovery.h"
#include "gateway/request/failover.h"
#include "gateway/request/response_state.h"
#include "gateway/upstream/stream_loop.h"

namespace pulse::gateway {

class AttemptDriver : public RelayJob {
public:
    // served: the response ended here (completed, incomplete or failed for good);
    // retry: another endpoint or round may serve it (the failover plan decides);
    // final: nothing more to try (the client left, or the failure would repeat anywhere).
    enum class Result { served, retry, final };

    AttemptDriver(ResponseState& st, FailoverPlan& plan) : st_(st), plan_(plan) {}
    // Sends the request to endpoint `i` and follows it to the end, or to the point where
    // another endpoint should be tried.
    Result run(size_t i);

    // RelayJob: called on the stream loop's thread while relay() waits.
    server::Exchange& client() override { return st_.ex; }
    bool on_upstream(UpEvent e) override;
    bool on_timer() override;
    void on_cut() override;
    std::chrono::steady_clock::time_point next_timer() const override;
    void on_client_lost() override;
    void take_output(std::string& wire) override { st_.sink.take(wire); }

private:
    // Within an attempt: again — the same endpoint once more on a fresh connection (a pooled
    // one had gone stale); resend — once more with a rebuilt request (the backend refused the
    // reasoning budget).
    enum class Step { served, retry, final, again, resend };

    Step run_http(const EndpointRef& ep);
    Step run_plugin(const EndpointRef& ep);
    Step relay(std::unique_ptr<DetachedBody> body, const EndpointRef& ep);
    std::optional<Step> prepare_on(const EndpointRef& ep);
    std::optional<Step> on_event(UpEvent e, const EndpointRef& ep);
    Step on_rejected(const UpEvent& e, const EndpointRef& ep);
    std::optional<Step> on_data(const UpEvent& e, const EndpointRef& ep);
    Step on_done(const EndpointRef& ep);
    Step endpoint_failure(const EndpointRef& ep, pulse_status_t status, const std::string& why);
    std::optional<Step> resumed(Resume r);
    Step cancel_stream();
    UpEvent cut_event() const;

    ResponseState& st_;
    FailoverPlan& plan_;
    bool fed_ = false;  // the current attempt produced data
    const EndpointRef* relay_ep_ = nullptr;
    std::optional<Step> relay_result_;
};

}  // namespace pulse::gateway
