#include "gateway/request/attempt.h"

#include <algorithm>

#include "common/log.h"
#include "common/metrics.h"
#include "gateway/background/prefix_store.h"
#include "gateway/background/warmup.h"
#include "gateway/protocol/status_errors.h"
#include "gateway/request/attempt_recovery.h"

namespace pulse::gateway {

using namespace std::chrono;

// Sends the profile's preparatory request to `ep` (once per response) and builds the request
// with its answer; an in-process backend is not asked (the profile builds without one). A
// value when the attempt is over: `ep` failed (another endpoint may serve), or the profile
// refused to build the request.
std::optional<AttemptDriver::Step> AttemptDriver::prepare_on(const EndpointRef& ep) {
    if (!ep.backend) {
        std::string answer;
        const pulse_upstream_req& prep = *st_.profile->preparatory();
        const int status = post_prepared(*ep.cfg, prep, st_.cfg.upstream, &answer);
        metrics::global()
            .counter("pulse_prepared_requests_total", "preparatory requests a profile asked for (SDK 1.3 prepare: a rendered prompt)",
                     {{"model", st_.req.model_id}, {"endpoint", ep.cfg->name}, {"outcome", status >= 200 && status <= 299 ? "ok" : "failed"}})
            .add();
        if (status < 200 || status > 299) {
            UpEvent e;
            e.kind = status ? UpEvent::Kind::rejected : UpEvent::Kind::failed;
            e.http_status = status;
            e.status = PULSE_E_UNAVAILABLE;
            e.text = status ? answer : "the preparatory request " + prep.path + " failed: " + answer;
            return on_event(std::move(e), ep).value_or(Step::retry);
        }
        if (!st_.profile->set_prepared(answer))
            return endpoint_failure(ep, PULSE_E_UNAVAILABLE, "the answer to the preparatory request " + prep.path + " is not JSON");
    }
    if (pulse_status_t rc = st_.profile->build(st_.builder.get()); rc != PULSE_OK) {
        st_.refused_by_profile(rc);
        return Step::final;
    }
    return std::nullopt;
}

// What a resume verdict means for this attempt: the response ended here, goes on at the next
// endpoint, or (nullopt) ends as failed, as it would have without resume.
std::optional<AttemptDriver::Step> AttemptDriver::resumed(Resume r) {
    switch (r) {
        case Resume::ended: return Step::served;
        case Resume::next_endpoint: return Step::retry;
        case Resume::impossible: break;
    }
    return std::nullopt;
}

// The failure an attempt sees when the gateway cuts its streams at the drain deadline.
UpEvent AttemptDriver::cut_event() const {
    UpEvent e;
    e.kind = UpEvent::Kind::failed;
    e.status = PULSE_E_UNAVAILABLE;
    e.text = "the gateway is shutting down (server.drain_timeout_s passed); retry the request";
    return e;
}

// Sends the request to endpoint `i` and follows it to the end, or to the point where
// another endpoint should be tried. The stream loop relays the answer either way (relay()):
// an HTTP endpoint's response once the request is sent, a backend plugin's stream once started.
AttemptDriver::Result AttemptDriver::run(size_t i) {
    const EndpointRef& ep = st_.req.rt->endpoints[i];
    InFlight in_flight(*ep.health);
    st_.entry->attempt(ep.cfg->name);
    fed_ = false;
    std::optional<Step> step;
    if (!ep.start_error.empty()) step = endpoint_failure(ep, PULSE_E_UNAVAILABLE, ep.start_error);  // never an HTTP request to plugin://
    if (!step && !st_.profile->built()) step = prepare_on(ep);
    if (!step) step = ep.backend ? run_plugin(ep) : run_http(ep);
    switch (*step) {
        case Step::served: return Result::served;
        case Step::retry:
        case Step::again: return Result::retry;  // a stale connection twice: the endpoint failed
        case Step::final:
        case Step::resend: return Result::final;  // refused even without the budget
    }
    return Result::final;
}

// An HTTP endpoint: the request is sent here, its answer relayed by the stream loop.
AttemptDriver::Step AttemptDriver::run_http(const EndpointRef& ep) {
    for (bool fresh = false, resent = false;;) {
        UpEvent error;
        // Before any output the retry window bounds the attempt too (upstream.h, send_http);
        // once the client has output, the stream is served and resumed on liveness alone.
        const auto window_end = st_.cfg.upstream.retry_window_s > 0 && !st_.builder->has_output()
                                    ? st_.t0 + duration_cast<steady_clock::duration>(duration<double>(st_.cfg.upstream.retry_window_s))
                                    : steady_clock::time_point::max();
        std::unique_ptr<DetachedBody> body = send_http(*ep.cfg, st_.profile->active(), st_.cfg.upstream, fresh, error, st_.gw.liveness(), window_end);
        Step a = body ? relay(std::move(body), ep) : on_event(std::move(error), ep).value_or(Step::retry);
        if (a == Step::resend && !resent) {
            resent = true;
            continue;
        }
        if (a != Step::again || fresh) return a;
        fresh = true;
        // A race the pool's look cannot see (the backend closed as the request left): rare.
        log::info("upstream", "the backend had closed the pooled connection to " + ep.cfg->name + "; sending again on a fresh one");
    }
}

// A backend plugin: its stream, started here, is relayed by the stream loop like an HTTP response.
AttemptDriver::Step AttemptDriver::run_plugin(const EndpointRef& ep) {
    UpEvent error;
    std::unique_ptr<DetachedBody> body = ep.backend->open(st_.profile->active().body.text(), st_.id, st_.cfg.upstream, error);
    return body ? relay(std::move(body), ep) : on_event(std::move(error), ep).value_or(Step::retry);
}

AttemptDriver::Step AttemptDriver::cancel_stream() {
    st_.profile->finish(PULSE_STREAM_CANCELLED, *st_.builder);
    st_.outcome = Outcome::cancelled;
    return Step::final;
}

// Endpoint `ep` failed during this attempt (dropped, timed out, or sent what cannot be read):
// before any output another endpoint, or this one later, serves the request; after output
// the response is resumed elsewhere when it can be, else it ends here.
AttemptDriver::Step AttemptDriver::endpoint_failure(const EndpointRef& ep, pulse_status_t status, const std::string& why) {
    st_.last_status = status;
    st_.last_error = why;
    if (st_.gw.cutting() || !retryable(st_.last_status)) {
        // No other endpoint is tried: the gateway is stopping, or the backend plugin
        // failed in a way that says it would fail again (a bug, not an outage).
        log::warn("responses", st_.id + ": endpoint " + ep.cfg->name + " failed: " + why);
        if (st_.builder->has_output()) {
            st_.profile->finish(PULSE_STREAM_TRUNCATED, *st_.builder);
            st_.builder->fail(st_.last_status, why);
            st_.outcome = Outcome::failed;
            return Step::served;
        }
        return Step::final;
    }
    if (!st_.builder->attempt_has_output()) {
        // Nothing of this attempt reached the client (at most the role chunk, which
        // carries no output): another endpoint, or this one later, may serve it.
        log::warn("responses", st_.id + ": endpoint " + ep.cfg->name + " failed: " + why);
        st_.failures[ep.cfg->name] = why;
        st_.gw.endpoint_failed(ep, why, /*real_request=*/true);
        if (fed_ && st_.profile->restart(st_.builder.get()) != PULSE_OK) return Step::final;  // the profile starts afresh
        return Step::retry;
    }
    if (auto a = resumed(resume_elsewhere(st_, ep, why))) return *a;
    st_.profile->finish(PULSE_STREAM_TRUNCATED, *st_.builder);
    st_.outcome = outcome_of(st_.builder->end(PULSE_STREAM_TRUNCATED, why));
    return Step::served;
}

// One event from endpoint `ep`; a value when the attempt is over. Runs on the request's
// thread (backend plugins) or on the stream loop's (HTTP), never on both at once.
std::optional<AttemptDriver::Step> AttemptDriver::on_event(UpEvent e, const EndpointRef& ep) {
    switch (e.kind) {
        case UpEvent::Kind::timeout:
            st_.keepalive_if_due();
            return std::nullopt;
        case UpEvent::Kind::accepted:
            st_.served_by = ep.cfg->name;
            st_.gw.endpoint_ok(st_.req.model_id, ep, /*real_request=*/true);
            st_.builder->start();
            st_.entry->accepted();
            return std::nullopt;
        case UpEvent::Kind::rejected: return on_rejected(e, ep);
        case UpEvent::Kind::failed:
            if (e.stale) return Step::again;
            return endpoint_failure(ep, e.status ? e.status : PULSE_E_UNAVAILABLE, e.text);
        case UpEvent::Kind::progress:
            st_.entry->prefill(e.progress.processed, e.progress.total, e.progress.cached, e.progress.time_ms);
            st_.keepalive_if_due();
            return std::nullopt;
        case UpEvent::Kind::data: return on_data(e, ep);
        case UpEvent::Kind::done: return on_done(ep);
    }
    return std::nullopt;
}

// The endpoint answered the request with an error status (or refused it before any stream).
AttemptDriver::Step AttemptDriver::on_rejected(const UpEvent& e, const EndpointRef& ep) {
    if (e.http_status == 400 && st_.budget && !st_.profile->resuming() && drop_refused_budget(st_, ep, e.text)) return Step::resend;
    pulse_status_t s = e.status;
    if (e.http_status) {
        std::optional<std::string> said;
        s = st_.profile->map_error(e.http_status, e.text, &said);
        st_.last_error = said ? *said : "backend answered HTTP " + std::to_string(e.http_status) + ": " + e.text.substr(0, 300);
    } else {
        st_.last_error = e.text;
    }
    st_.last_status = s;
    if (e.retry_after_s > 0) st_.retry_after_s = e.retry_after_s;
    log::warn("responses", st_.id + ": endpoint " + ep.cfg->name + " refused the request: " + st_.last_error);
    if (!retryable(s)) return Step::final;
    if (e.http_status == 500) {
        // A server that answers 500 is up; one that answers this request with the
        // same 500 twice will answer it so every time (an input it cannot take):
        // it is not asked again, and not marked down for it. Other endpoints may
        // still serve the request; when none is left, the answer is this error.
        plan_.refused_500(static_cast<size_t>(&ep - st_.req.rt->endpoints.data()), e.text, st_.last_error);
        return Step::retry;
    }
    if (e.http_status == 404) {
        // Not found: the server does not serve this model name (vLLM without the right
        // --served-model-name) or nothing at this path. It will answer every request so until
        // someone changes its setup: down now, with that reason, and failed over at once.
        st_.last_error = "misconfigured: " + st_.last_error + " (the server does not serve model '" + st_.req.rt->cfg->upstream_model +
                         "' at " + ep.cfg->url + ": check its served model name and the endpoint's url)";
        ep.health->set_misconfigured(true);
    }
    st_.failures[ep.cfg->name] = st_.last_error;
    st_.gw.endpoint_failed(ep, st_.last_error, /*real_request=*/true);
    return Step::retry;
}

// Output from the endpoint, through the profile into the response.
std::optional<AttemptDriver::Step> AttemptDriver::on_data(const UpEvent& e, const EndpointRef& ep) {
    if (!st_.ttft) st_.ttft = duration_cast<milliseconds>(steady_clock::now() - st_.t0);
    fed_ = true;
    pulse_status_t s = st_.profile->feed(e.text, *st_.builder);
    // A profile's feed answering UNAVAILABLE says the upstream's stream failed at
    // this chunk (an engine error event, a chunk that is not JSON): the endpoint
    // failed as if it had dropped here — another endpoint before any output, resume
    // after (docs/SDK.md, "Status codes").
    if (s < 0 && retryable(s))
        return endpoint_failure(ep, s, "the backend's stream failed: " + st_.profile->error(s));
    if (s < 0) {
        st_.builder->fail(s, st_.profile->error(s));
        st_.outcome = Outcome::failed;
        return Step::served;
    }
    // The model's output could not be delivered (a broken tool call, reported through
    // the sink) after output began: another endpoint continues the response.
    if (auto f = st_.builder->failure(); f && retryable(f->first) && st_.builder->attempt_has_output()) {
        st_.last_status = f->first;
        st_.last_error = f->second;
        if (auto a = resumed(resume_elsewhere(st_, ep, "the backend's output could not be used mid-stream: " + f->second))) return *a;
    }
    st_.entry->output(st_.builder->spent().output);
    st_.keepalive_if_due();
    return std::nullopt;
}

// The endpoint ended its stream.
AttemptDriver::Step AttemptDriver::on_done(const EndpointRef& ep) {
    pulse_status_t s = st_.profile->finish(PULSE_STREAM_CLEAN, *st_.builder);
    if (s < 0) st_.builder->fail(s, st_.profile->error(s));
    st_.outcome = st_.builder->ended() ? (st_.builder->failure() ? Outcome::failed : Outcome::completed)
                                 : outcome_of(st_.builder->end(PULSE_STREAM_CLEAN));
    if (st_.outcome == Outcome::completed || st_.outcome == Outcome::incomplete) {
        // What the profile turns into a replay (warm_request) when the endpoint comes back.
        if (!ep.backend) st_.gw.prefixes().remember(st_.req.model_id, st_.req.conversation, st_.profile->request());
        if (st_.gw.warmer() && !ep.backend) {
            st_.gw.warmer()->served(*ep.cfg, ep.health, BackendDialect(*st_.req.rt, st_.snap));
            if (auto u = st_.builder->usage_totals(); u.reported) st_.gw.warmer()->first_turn(*ep.cfg, *ep.health, u.input, u.cached);
        }
    }
    return Step::served;
}

// A sent HTTP request's response, followed by the stream loop while this thread sleeps.
AttemptDriver::Step AttemptDriver::relay(std::unique_ptr<DetachedBody> body, const EndpointRef& ep) {
    st_.flush();
    if (st_.sink.lost()) return cancel_stream();  // `body` closes the connection
    relay_ep_ = &ep;
    relay_result_.reset();
    st_.relaying = true;
    st_.gw.relay().run(*this, std::move(body));
    st_.relaying = false;
    return relay_result_.value_or(Step::final);
}


// RelayJob

bool AttemptDriver::on_upstream(UpEvent e) {
    relay_result_ = on_event(std::move(e), *relay_ep_);
    return relay_result_.has_value();
}

bool AttemptDriver::on_timer() {
    st_.keepalive_if_due();
    return false;
}

void AttemptDriver::on_cut() {
    relay_result_ = on_event(cut_event(), *relay_ep_);
    if (!relay_result_) relay_result_ = Step::final;
}

steady_clock::time_point AttemptDriver::next_timer() const {
    return st_.req.streaming ? st_.last_event + st_.keepalive : steady_clock::time_point::max();
}

void AttemptDriver::on_client_lost() {  // the loop has marked the exchange lost
    relay_result_ = cancel_stream();
}

}  // namespace pulse::gateway
