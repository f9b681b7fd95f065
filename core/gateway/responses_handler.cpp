// POST /v1/responses: validate, translate, send to the first endpoint that takes the request
// (retrying across endpoints with backoff inside the retry window while nothing has been
// sent), stream the translated events back (or aggregate them for stream:false).
//
// The pieces, in the order a request meets them:
//   ClientWriter     the one way bytes reach the client (SSE framed for its HTTP version)
//   ResponseSession  read_and_validate -> translate -> serve (the failover loop) -> finish
//     attempt()      one endpoint: an HTTP response relayed by the stream loop, or a backend
//                    plugin's stream followed on this thread
//     on_event()     what each upstream event does to the response (both paths)
//     finish()       the answer's end, the one place the last bytes are written
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"
#include "gateway/failover.h"
#include "gateway/gateway.h"
#include "gateway/http_util.h"
#include "gateway/profile_session.h"
#include "gateway/request_plan.h"
#include "gateway/request_record.h"
#include "gateway/responses_api.h"

namespace pulse::gateway {
namespace {

using namespace std::chrono;

std::string new_response_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char* hex = "0123456789abcdef";
    std::string s = "resp_";
    for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
    return s;
}

struct HttpError {
    int status;
    const char* type;
    const char* code;
    int retry_after;
};

// How a status reaches an HTTP client that has not seen any event yet (docs/SDK.md, "Status
// codes"). Never 500: Codex hides a 500's message behind "high demand". A plugin's own failure
// (INTERNAL, ABI, CANCELLED while the client is still there) is a 502 that says what failed,
// with no Retry-After: asking again gives the same answer.
HttpError http_error_for(pulse_status_t s) {
    switch (s) {
        case PULSE_E_INVALID_ARGUMENT:
        case PULSE_E_UNSUPPORTED: return {400, "invalid_request_error", "invalid_request", 0};
        case PULSE_E_CONTEXT_LENGTH: return {400, "invalid_request_error", "context_length_exceeded", 0};
        case PULSE_E_UNAVAILABLE:
        case PULSE_E_RESOURCE_EXHAUSTED: return {503, "server_error", "backend_unavailable", 1};
        case PULSE_E_DEADLINE: return {504, "server_error", "timeout", 1};
        case PULSE_E_INTERNAL:
        case PULSE_E_ABI:
        case PULSE_E_CANCELLED: return {502, "server_error", "plugin_error", 0};
        default: return {502, "server_error", "bad_gateway", 1};
    }
}

// Only these are worth another endpoint or another round: the rest give the same answer again.
bool retryable(pulse_status_t s) { return s == PULSE_E_UNAVAILABLE || s == PULSE_E_RESOURCE_EXHAUSTED; }

// Everything a streamed response sends goes through here: SSE events, framed for the client's
// HTTP version, preceded by the head. The bytes leave from the request's thread (flush()) or
// from the stream loop (take(), while it relays).
class ClientWriter {
public:
    explicit ClientWriter(server::Exchange& ex) : ex_(ex) {}

    void event(std::string_view type, std::string_view json) {
        events_ += "event: ";
        events_ += type;
        events_ += "\ndata: ";
        events_ += json;
        events_ += "\n\n";
    }
    // The framed bytes produced since the last take, the head first.
    void take(std::string& wire) {
        if (events_.empty()) return;
        if (!head_sent_) {
            head_sent_ = true;
            server::Headers h = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
            h.insert(h.end(), extra_.begin(), extra_.end());
            ex_.stream_head(wire, "text/event-stream", h);
        }
        ex_.frame(wire, events_);
        events_.clear();
    }
    // A header for the head, if the head has not gone out yet (false when it has).
    bool add_header(std::string name, std::string value) {
        if (head_sent_) return false;
        std::erase_if(extra_, [&](const auto& h) { return h.first == name; });  // the latest value wins
        extra_.emplace_back(std::move(name), std::move(value));
        return true;
    }
    // Bytes the stream loop could not send before its job ended: they go first.
    void put_back(std::string unsent) { wire_.insert(0, unsent); }
    // Sends what is queued (blocking, bounded by the send timeout). False once the client is lost.
    bool flush() {
        take(wire_);
        if (!wire_.empty() && !ex_.lost()) ex_.write(wire_);
        wire_.clear();
        return !ex_.lost();
    }
    // The end of the body (the last chunk); false when the client did not take it.
    bool end() {
        if (!head_sent_) return !ex_.lost();
        ex_.stream_end(wire_);
        return flush();
    }

private:
    server::Exchange& ex_;
    std::string events_;  // SSE text not yet framed
    std::string wire_;    // framed bytes not yet sent
    server::Headers extra_;
    bool head_sent_ = false;
};

}  // namespace

// One /v1/responses request from receipt to the last byte.
class ResponseSession : public RelayJob {
public:
    ResponseSession(Gateway& gw, server::Exchange& ex)
        : gw_(gw), ex_(ex), snap_(gw.snapshot()), cfg_(snap_->cfg), id_(new_response_id()), writer_(ex) {}

    void run() {
        if (read_and_validate() && (apply_policy(req_, id_), translate())) {
            report_budget();
            serve();
        }
        finish();
    }

private:
    // again: the same endpoint once more on a fresh connection (a pooled one had gone stale).
    // resend: the same endpoint once more with a rebuilt request (it refused the reasoning budget).
    enum class Attempt { served, retry, final, again, resend };

    bool read_and_validate() {
        if (auto e = plan_request(ex_.body(), *snap_, id_, req_)) return invalid(*e);
        entry_ = gw_.board_.begin(id_, req_.model_id, req_.streaming);
        return true;
    }

    // A reasoning budget (from the policy, or the client's reasoning.budget_tokens) is reported
    // as the profile applied it: enforced by the backend, or not (a header and a log line).
    void report_budget() {
        budget_ = budget_report(req_, profile_->request().notes);
        if (!budget_) return;
        if (req_.streaming) writer_.add_header("X-Pulse-Reasoning-Budget", budget_->header());
        metrics::global()
            .counter("pulse_reasoning_budget_requests_total", "requests with a reasoning budget, by whether the backend enforces it",
                     {{"model", req_.model_id}, {"enforced", budget_->enforced ? "yes" : "no"}})
            .add();
        if (!budget_->enforced) log::warn("policy", id_ + ": reasoning budget " + std::to_string(budget_->budget) + " " + budget_->how);
    }

    // A backend that refuses the request because of its reasoning budget field (vLLM without a
    // reasoning config, or on a model runner without budgets, answers 400 naming the field): the
    // request is sent again without the budget, reported as not enforced. A policy never costs
    // the request.
    bool drop_refused_budget(const EndpointRef& ep, const std::string& body) {
        const std::string field = budget_->field;
        if (field.empty() || body.find(field) == std::string::npos) return false;
        req_.doc["reasoning"].RemoveMember("budget_tokens");
        if (profile_->build(builder_.get()) != PULSE_OK) return false;
        const std::string why = "not enforced: endpoint " + ep.cfg->name + " refused " + field + " (" + body.substr(0, 160) + ")";
        log::warn("policy", id_ + ": reasoning budget " + std::to_string(budget_->budget) + " " + why + "; sent again without it");
        budget_->how = why;
        budget_->field.clear();
        metrics::global()
            .counter("pulse_reasoning_budget_refused_total", "requests sent again without their reasoning budget because the backend refused it",
                     {{"model", req_.model_id}, {"endpoint", ep.cfg->name}})
            .add();
        budget_->enforced = false;
        if (req_.streaming) writer_.add_header("X-Pulse-Reasoning-Budget", budget_->header());
        return true;
    }

    bool invalid(const RequestError& e) {
        ex_.close_after();  // a client that sent garbage gets no second chance on this connection
        metrics::global().counter("pulse_invalid_requests_total", "requests refused with a 4xx before translation", {{"code", e.code}}).add();
        send_error(ex_, e.http_status, "invalid_request_error", e.message, e.param, e.code);
        outcome_ = Outcome::invalid;
        return false;
    }

    bool translate() {
        profile_ = std::make_unique<ProfileSession>(req_, id_);
        // SDK 1.3: a profile that needs an answer from the backend first has its request built
        // at the first attempt on an HTTP endpoint, once that answer is in (prepare_on).
        if (pulse_status_t rc = profile_->prepare(); rc != PULSE_OK) return refused_by_profile(rc);
        if (!profile_->preparatory())
            if (pulse_status_t rc = profile_->build(nullptr); rc != PULSE_OK) return refused_by_profile(rc);
        builder_ = std::make_unique<ResponseBuilder>(id_, req_.model_id, req_.rt->reasoning, [this](std::string_view type, std::string_view json) {
            if (!req_.streaming) return;
            last_event_ = steady_clock::now();
            writer_.event(type, json);
        });
        keepalive_ = milliseconds(static_cast<int64_t>(cfg_.upstream.keepalive_s * 1000));
        return true;
    }

    // Fails the request as the profile said (`rc`, with the profile's message).
    bool refused_by_profile(pulse_status_t rc) {
        last_status_ = rc;
        last_error_ = profile_->error(rc);
        if (http_error_for(rc).status >= 500) log::error("responses", id_ + ": " + last_error_);
        outcome_ = Outcome::rejected;
        return false;
    }

    // Sends the profile's preparatory request to `ep` (once per response) and builds the request
    // with its answer; an in-process backend is not asked (the profile builds without one). A
    // value when the attempt is over: `ep` failed (another endpoint may serve), or the profile
    // refused to build the request.
    std::optional<Attempt> prepare_on(const EndpointRef& ep) {
        if (!ep.backend) {
            std::string answer;
            const pulse_upstream_req& prep = *profile_->preparatory();
            const int status = post_prepared(*ep.cfg, prep, cfg_.upstream, &answer);
            metrics::global()
                .counter("pulse_prepared_requests_total", "preparatory requests a profile asked for (SDK 1.3 prepare: a rendered prompt)",
                         {{"model", req_.model_id}, {"endpoint", ep.cfg->name}, {"outcome", status >= 200 && status <= 299 ? "ok" : "failed"}})
                .add();
            if (status < 200 || status > 299) {
                UpEvent e;
                e.kind = status ? UpEvent::Kind::rejected : UpEvent::Kind::failed;
                e.http_status = status;
                e.status = PULSE_E_UNAVAILABLE;
                e.text = status ? answer : "the preparatory request " + prep.path + " failed: " + answer;
                return on_event(std::move(e), ep).value_or(Attempt::retry);
            }
            if (!profile_->set_prepared(answer))
                return endpoint_failure(ep, PULSE_E_UNAVAILABLE, "the answer to the preparatory request " + prep.path + " is not JSON");
        }
        if (pulse_status_t rc = profile_->build(builder_.get()); rc != PULSE_OK) {
            refused_by_profile(rc);
            return Attempt::final;
        }
        return std::nullopt;
    }

    // Mid-stream resume: endpoint `ep` failed (`why`) after this response's output began. When
    // the model allows it and the profile can, the response continues on the next endpoint the
    // failover loop tries (Attempt::retry), from exactly what the client has; otherwise nullopt
    // and the caller ends the response as failed, as it would have without resume.
    std::optional<Attempt> resume_elsewhere(const EndpointRef& ep, const std::string& why) {
        // Bounded like any failover: the loop in serve() ends its rounds with the retry window.
        if (!req_.rt->cfg->resume || !profile_->can_resume() || gw_.cutting() || lost_ || !builder_->can_resume()) return std::nullopt;
        // The answer already has every token the client allowed: it ends as an uninterrupted one
        // cut at that limit would, not with a continuation that would go past it.
        if (auto limit = req_.output_limit(); limit && builder_->spent().output >= *limit) {
            profile_->finish(PULSE_STREAM_TRUNCATED, *builder_);
            builder_->begin_resume();  // drops the attempt's failure; its tokens count in the usage
            builder_->finish(PULSE_FINISH_LENGTH);
            outcome_ = outcome_of(builder_->end(PULSE_STREAM_CLEAN));
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why + ") after the answer reached max_output_tokens (" +
                                       std::to_string(*limit) + "): it ends incomplete, as it would have there");
            return Attempt::served;
        }
        if (pulse_status_t rc = profile_->resume(*builder_); rc != PULSE_OK) {
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why +
                                       "); the response cannot be resumed: " + profile_->error(rc));
            return std::nullopt;
        }
        gw_.endpoint_failed(ep, why, /*real_request=*/true);
        builder_->begin_resume();
        ++resumes_;
        entry_->resumed();
        metrics::global()
            .counter(metrics::kResumed.name, metrics::kResumed.help,
                     {{"model", req_.model_id}, {"endpoint", ep.cfg->name}})
            .add();
        log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why + "); resuming the response after " +
                                   std::to_string(profile_->resumed_from().first) + " bytes of text and " +
                                   std::to_string(profile_->resumed_from().second) + " of reasoning on the next endpoint, " + profile_->resumed_by());
        return Attempt::retry;
    }

    steady_clock::time_point window_end() const {
        return t0_ + duration_cast<steady_clock::duration>(duration<double>(cfg_.upstream.retry_window_s));
    }

    // Sends what is queued to the client, unless the stream loop is the one sending now.
    void flush() {
        if (relaying_ || lost_) return;
        if (!writer_.flush()) lost_ = true;
    }

    void keepalive_if_due() {
        if (!req_.streaming || steady_clock::now() - last_event_ < keepalive_) return;
        builder_->keepalive();
        entry_->keepalive();
        flush();
        metrics::global().counter("pulse_keepalives_total", "response.in_progress keepalive events sent", {{"model", req_.model_id}}).add();
    }

    // The failure an attempt sees when the gateway cuts its streams at the drain deadline.
    UpEvent cut_event() const {
        UpEvent e;
        e.kind = UpEvent::Kind::failed;
        e.status = PULSE_E_UNAVAILABLE;
        e.text = "the gateway is shutting down (server.drain_timeout_s passed); retry the request";
        return e;
    }

    // Sends the request to endpoint `i` and follows it to the end, or to the point where
    // another endpoint should be tried. An HTTP endpoint's response is read by the stream loop
    // (relay()) once the request is sent; a backend plugin's stream is followed on this thread.
    Attempt attempt(size_t i) {
        const EndpointRef& ep = req_.rt->endpoints[i];
        InFlight in_flight(*ep.health);
        entry_->attempt(ep.cfg->name);
        fed_ = false;
        if (!profile_->built())
            if (auto a = prepare_on(ep)) return *a;
        if (!ep.backend) {
            for (bool fresh = false, resent = false;;) {
                UpEvent error;
                std::unique_ptr<DetachedBody> body = send_http(*ep.cfg, profile_->active(), cfg_.upstream, fresh, error, gw_.liveness_.get());
                Attempt a = body ? relay(std::move(body), ep) : on_event(std::move(error), ep).value_or(Attempt::retry);
                if (a == Attempt::resend && !resent) {
                    resent = true;
                    continue;
                }
                if (a == Attempt::resend) return Attempt::final;
                if (a != Attempt::again || fresh) return a == Attempt::again ? Attempt::retry : a;
                fresh = true;
                // A race the pool's look cannot see (the backend closed as the request left): rare.
                log::info("upstream", "the backend had closed the pooled connection to " + ep.cfg->name + "; sending again on a fresh one");
            }
        }
        std::unique_ptr<UpstreamStream> up = ep.backend->open(profile_->active().body.text(), id_, cfg_.upstream);
        // Short waits, so a client that left or the drain deadline are noticed promptly; a
        // backend's stream_next returns as soon as it has a chunk, so they cost nothing when busy.
        const milliseconds wait = std::min(keepalive_, milliseconds(200));
        for (;;) {
            // Drain what is already queued before flushing: under load many tokens go out in
            // one write instead of one syscall each.
            UpEvent e = up->next(milliseconds(0));
            if (e.kind == UpEvent::Kind::timeout) {
                flush();
                e = up->next(wait);
            }
            if (!lost_ && steady_clock::now() - last_gone_check_ > milliseconds(100)) {
                last_gone_check_ = steady_clock::now();
                if (ex_.client_gone()) lost_ = true;
            }
            if (lost_) {
                up->cancel();
                return cancel_stream();
            }
            if (gw_.cutting()) {
                up->cancel();
                e = cut_event();
            }
            if (auto a = on_event(std::move(e), ep)) return *a;
        }
    }

    Attempt cancel_stream() {
        profile_->finish(PULSE_STREAM_CANCELLED, *builder_);
        outcome_ = Outcome::cancelled;
        return Attempt::final;
    }

    // Endpoint `ep` failed during this attempt (dropped, timed out, or sent what cannot be read):
    // before any output another endpoint, or this one later, serves the request; after output
    // the response is resumed elsewhere when it can be, else it ends here.
    Attempt endpoint_failure(const EndpointRef& ep, pulse_status_t status, const std::string& why) {
        last_status_ = status;
        last_error_ = why;
        if (gw_.cutting() || !retryable(last_status_)) {
            // No other endpoint is tried: the gateway is stopping, or the backend plugin
            // failed in a way that says it would fail again (a bug, not an outage).
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed: " + why);
            if (builder_->has_output()) {
                profile_->finish(PULSE_STREAM_TRUNCATED, *builder_);
                builder_->fail(last_status_, why);
                outcome_ = Outcome::failed;
                return Attempt::served;
            }
            return Attempt::final;
        }
        if (!builder_->attempt_has_output()) {
            // Nothing of this attempt reached the client (at most the role chunk, which
            // carries no output): another endpoint, or this one later, may serve it.
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed: " + why);
            gw_.endpoint_failed(ep, why, /*real_request=*/true);
            if (fed_ && profile_->restart(builder_.get()) != PULSE_OK) return Attempt::final;  // the profile starts afresh
            return Attempt::retry;
        }
        if (auto a = resume_elsewhere(ep, why)) return *a;
        profile_->finish(PULSE_STREAM_TRUNCATED, *builder_);
        outcome_ = outcome_of(builder_->end(PULSE_STREAM_TRUNCATED, why));
        return Attempt::served;
    }

    // One event from endpoint `ep`; a value when the attempt is over. Runs on the request's
    // thread (backend plugins) or on the stream loop's (HTTP), never on both at once.
    std::optional<Attempt> on_event(UpEvent e, const EndpointRef& ep) {
        switch (e.kind) {
            case UpEvent::Kind::timeout:
                keepalive_if_due();
                return std::nullopt;
            case UpEvent::Kind::accepted:
                served_by_ = ep.cfg->name;
                gw_.endpoint_ok(req_.model_id, ep, /*real_request=*/true);
                builder_->start();
                entry_->accepted();
                return std::nullopt;
            case UpEvent::Kind::rejected: {
                if (e.http_status == 400 && budget_ && !profile_->resuming() && drop_refused_budget(ep, e.text)) return Attempt::resend;
                pulse_status_t s = e.status;
                if (e.http_status) {
                    std::optional<std::string> said;
                    s = profile_->map_error(e.http_status, e.text, &said);
                    last_error_ = said ? *said : "backend answered HTTP " + std::to_string(e.http_status) + ": " + e.text.substr(0, 300);
                } else {
                    last_error_ = e.text;
                }
                last_status_ = s;
                if (e.retry_after_s > 0) retry_after_s_ = e.retry_after_s;
                log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " refused the request: " + last_error_);
                if (!retryable(s)) return Attempt::final;
                if (e.http_status == 500) {
                    // A server that answers 500 is up; one that answers this request with the
                    // same 500 twice will answer it so every time (an input it cannot take):
                    // it is not asked again, and not marked down for it. Other endpoints may
                    // still serve the request; when none is left, the answer is this error.
                    plan_->refused_500(static_cast<size_t>(&ep - req_.rt->endpoints.data()), e.text, last_error_);
                    return Attempt::retry;
                }
                gw_.endpoint_failed(ep, last_error_, /*real_request=*/true);
                return Attempt::retry;
            }
            case UpEvent::Kind::failed:
                if (e.stale) return Attempt::again;
                return endpoint_failure(ep, e.status ? e.status : PULSE_E_UNAVAILABLE, e.text);
            case UpEvent::Kind::data: {
                if (!ttft_) ttft_ = duration_cast<milliseconds>(steady_clock::now() - t0_);
                fed_ = true;
                pulse_status_t s = profile_->feed(e.text, *builder_);
                // A profile's feed answering UNAVAILABLE says the upstream's stream failed at
                // this chunk (an engine error event, a chunk that is not JSON): the endpoint
                // failed as if it had dropped here — another endpoint before any output, resume
                // after (docs/SDK.md, "Status codes").
                if (s < 0 && retryable(s))
                    return endpoint_failure(ep, s, "the backend's stream failed: " + profile_->error(s));
                if (s < 0) {
                    builder_->fail(s, profile_->error(s));
                    outcome_ = Outcome::failed;
                    return Attempt::served;
                }
                // The model's output could not be delivered (a broken tool call, reported through
                // the sink) after output began: another endpoint continues the response.
                if (auto f = builder_->failure(); f && retryable(f->first) && builder_->attempt_has_output()) {
                    last_status_ = f->first;
                    last_error_ = f->second;
                    if (auto a = resume_elsewhere(ep, "the backend's output could not be used mid-stream: " + f->second)) return *a;
                }
                entry_->output(builder_->spent().output);
                keepalive_if_due();
                return std::nullopt;
            }
            case UpEvent::Kind::done: {
                pulse_status_t s = profile_->finish(PULSE_STREAM_CLEAN, *builder_);
                if (s < 0) builder_->fail(s, profile_->error(s));
                outcome_ = builder_->ended() ? (builder_->failure() ? Outcome::failed : Outcome::completed)
                                             : outcome_of(builder_->end(PULSE_STREAM_CLEAN));
                if (outcome_ == Outcome::completed || outcome_ == Outcome::incomplete) {
                    // Replays go to the chat path: a raw completion (resume = "tokens") is not kept.
                    if (const auto& r = profile_->request(); r.path == "/chat/completions" && !r.root_path)
                        gw_.prefixes_->remember(req_.model_id, req_.conversation, r.body.text());
                    if (gw_.warmer_ && !ep.backend) {
                        gw_.warmer_->served(*ep.cfg, ep.health);
                        if (auto u = builder_->usage_totals(); u.reported) gw_.warmer_->first_turn(*ep.cfg, *ep.health, u.input, u.cached);
                    }
                }
                return Attempt::served;
            }
        }
        return std::nullopt;
    }

    // A sent HTTP request's response, followed by the stream loop while this thread sleeps.
    Attempt relay(std::unique_ptr<DetachedBody> body, const EndpointRef& ep) {
        flush();
        if (lost_) return cancel_stream();  // `body` closes the connection
        relay_ep_ = &ep;
        relay_result_.reset();
        relaying_ = true;
        std::string unsent;
        gw_.relay_->run(*this, std::move(body), unsent);
        relaying_ = false;
        writer_.put_back(std::move(unsent));
        return relay_result_.value_or(Attempt::final);
    }

public:  // RelayJob: called on the stream loop's thread while relay() waits
    server::Exchange& client() override { return ex_; }
    bool on_upstream(UpEvent e) override {
        relay_result_ = on_event(std::move(e), *relay_ep_);
        return relay_result_.has_value();
    }
    bool on_timer() override {
        keepalive_if_due();
        return false;
    }
    void on_cut() override {
        relay_result_ = on_event(cut_event(), *relay_ep_);
        if (!relay_result_) relay_result_ = Attempt::final;
    }
    steady_clock::time_point next_timer() const override { return req_.streaming ? last_event_ + keepalive_ : steady_clock::time_point::max(); }
    void on_client_lost() override {
        lost_ = true;
        relay_result_ = cancel_stream();
    }
    void take_output(std::string& wire) override { writer_.take(wire); }

private:
    // Waits before the next round, keeping the client alive and noticing if it leaves.
    void wait_backoff(steady_clock::duration d) {
        entry_->waiting();
        auto until = steady_clock::now() + d;
        while (!lost_ && !gw_.cutting() && steady_clock::now() < until) {
            std::this_thread::sleep_for(std::min<steady_clock::duration>(milliseconds(50), until - steady_clock::now()));
            if (ex_.client_gone()) lost_ = true;
            keepalive_if_due();
        }
    }

    // The failover loop: the plan says which endpoint next, when to wait, when to give up.
    void serve() {
        const size_t regular = static_cast<size_t>(
            std::count_if(req_.rt->endpoints.begin(), req_.rt->endpoints.end(), [](const EndpointRef& e) { return !e.cfg->last_resort; }));
        bool first_round = true;
        FailoverPlan plan(regular, req_.rt->last_resorts(), [&] {
            auto order = req_.rt->order(req_.conversation);
            if (first_round && req_.rt->cfg->routing == config::Model::Routing::sticky && !order.empty() && order.front() != req_.rt->home(req_.conversation))
                metrics::global()
                    .counter("pulse_sticky_moved_total", "sticky requests that started away from their conversation's endpoint (it was down)",
                             {{"model", req_.model_id}})
                    .add();
            first_round = false;
            return order;
        }, window_end());
        plan_ = &plan;
        while (!lost_ && !gw_.cutting()) {
            const auto step = plan.next({steady_clock::now(), req_.rt->regular_healthy(), retryable(last_status_)});
            if (step.kind == FailoverPlan::Step::Kind::give_up) {
                if (step.refused_for_good) {
                    last_status_ = PULSE_E_INVALID_ARGUMENT;
                    last_error_ = plan.deterministic_error();
                }
                break;
            }
            if (step.kind == FailoverPlan::Step::Kind::wait) {
                wait_backoff(step.wait);
                continue;
            }
            if (step.last_resort) {
                to_last_resort(req_.rt->endpoints[step.endpoint], step.last_resort);
            } else if (step.count != FailoverPlan::Step::Count::first) {
                if (!builder_->has_output()) entry_->failover();  // a resume's move is counted as one
                const bool retry = step.count == FailoverPlan::Step::Count::retry;
                metrics::global()
                    .counter(retry ? metrics::kRetries.name : metrics::kFailovers.name, retry ? metrics::kRetries.help : metrics::kFailovers.help,
                             {{"model", req_.model_id}})
                    .add();
            }
            plan.attempted(attempt(step.endpoint) == Attempt::retry);
        }
        plan_ = nullptr;
        if (lost_ && outcome_ == Outcome::none) outcome_ = Outcome::cancelled;
    }

    // The request goes to a last-resort endpoint (the plan allows it once per request), marked
    // in the response head (X-Pulse-Fallback), the log and pulse_last_resort_requests_total.
    void to_last_resort(const EndpointRef& ep, const char* reason) {
        const char* why = std::string_view(reason) == "all_down" ? "every other endpoint is down"
                                                                  : "no other endpoint took the request within the retry window";
        log::warn("responses", id_ + ": served by the last-resort endpoint " + ep.cfg->name + ": " + why);
        metrics::global()
            .counter("pulse_last_resort_requests_total", "requests sent to a last-resort endpoint because no other could serve them",
                     {{"model", req_.model_id}, {"endpoint", ep.cfg->name}, {"reason", reason}})
            .add();
        last_resort_ = ep.cfg->name;
        if (req_.streaming) writer_.add_header("X-Pulse-Fallback", "last-resort; endpoint=" + last_resort_);
    }

    // The response's end: the terminal event or the error, the request's record (trace,
    // metrics, log), then the last bytes. A client that saw the end sees its accounting.
    void finish() {
        if (outcome_ == Outcome::invalid) return;  // answered and counted
        std::optional<std::string> answer;         // a whole (non-streamed) response, written after the record
        int answer_status = 200;
        server::Headers answer_headers;
        if (!last_resort_.empty()) answer_headers.emplace_back("X-Pulse-Fallback", "last-resort; endpoint=" + last_resort_);
        if (budget_) answer_headers.emplace_back("X-Pulse-Reasoning-Budget", budget_->header());
        auto error_answer = [&](pulse_status_t s, const std::string& msg, const char* code = nullptr) {
            auto h = http_error_for(s);
            answer_status = h.status;
            int retry = h.retry_after ? std::max(h.retry_after, retry_after_s_) : 0;
            if (retry > 0) answer_headers.emplace_back("Retry-After", std::to_string(retry));
            answer = error_body(h.type, msg, {}, code ? code : h.code);
        };
        if (outcome_ == Outcome::none || outcome_ == Outcome::rejected) {
            // Only a request that went through the failover rounds spent the window; a profile
            // that refused it (outcome rejected) was answered at once, whatever its status.
            const bool window_spent = outcome_ == Outcome::none && retryable(last_status_);
            if (outcome_ == Outcome::none) outcome_ = window_spent ? Outcome::unavailable : Outcome::rejected;
            std::string msg = gw_.cutting() ? last_error_
                              : window_spent ? "no backend could take the request within " +
                                                   std::to_string(static_cast<int>(cfg_.upstream.retry_window_s)) + " s; last error: " + last_error_
                                             : last_error_;
            if (req_.streaming && builder_ && builder_->started())
                builder_->fail(last_status_, msg);  // SSE already open (keepalives): a terminal event
            else
                error_answer(last_status_, msg);
        } else if (!req_.streaming && outcome_ != Outcome::cancelled) {
            if (auto f = builder_->failure(); f && !builder_->has_output())
                error_answer(f->first, f->second, f->first == PULSE_E_CONTEXT_LENGTH ? "context_length_exceeded" : nullptr);
            else
                answer = builder_->final_response();
        }
        // Everything but the very end leaves first, so a client that stopped reading is known
        // before the request is recorded.
        if (req_.streaming && !answer && outcome_ != Outcome::cancelled && !lost_ && !writer_.flush()) lost_ = true;
        if (lost_ && outcome_ != Outcome::cancelled) outcome_ = Outcome::client_lost;
        record();
        if (outcome_ == Outcome::cancelled || outcome_ == Outcome::client_lost) return;
        bool delivered = answer ? (send_json(ex_, answer_status, *answer, answer_headers), !ex_.lost()) : writer_.end();
        if (!delivered) log::warn("responses", id_ + ": the client did not take the end of the response (" + name(outcome_) + ")");
    }

    void record() {
        gateway::record({id_, req_.model_id, served_by_, outcome_, t0_, ttft_, resumes_, builder_.get(), budget_ ? &*budget_ : nullptr}, gw_.board_,
                        entry_, cfg_.server.trace_file);
    }

    Gateway& gw_;
    server::Exchange& ex_;
    std::shared_ptr<const Snapshot> snap_;  // the config generation this request uses, to its end
    const config::Config& cfg_;
    const std::string id_;
    const steady_clock::time_point t0_ = steady_clock::now();

    RequestPlan req_;  // what the request asks for; its document's strings point into ex_.body()

    std::unique_ptr<ProfileSession> profile_;  // the profile's side of the request (after translate())
    std::unique_ptr<ResponseBuilder> builder_;
    int resumes_ = 0;
    std::optional<BudgetReport> budget_;  // the request's reasoning budget, if it has one, and how it is applied

    ClientWriter writer_;
    bool lost_ = false;
    milliseconds keepalive_{10000};
    steady_clock::time_point last_event_ = steady_clock::now();
    steady_clock::time_point last_gone_check_ = steady_clock::now();
    bool fed_ = false;  // the current attempt produced data

    bool relaying_ = false;  // the stream loop sends this response's bytes now
    const EndpointRef* relay_ep_ = nullptr;
    std::optional<Attempt> relay_result_;

    pulse_status_t last_status_ = PULSE_E_UNAVAILABLE;
    std::string last_error_ = "no endpoint configured";
    int retry_after_s_ = 0;  // the longest Retry-After a backend asked for
    FailoverPlan* plan_ = nullptr;  // the failover rules, while serve() runs
    std::string last_resort_;  // the last-resort endpoint this request went to, if any
    std::string served_by_;
    Outcome outcome_ = Outcome::none;
    std::optional<milliseconds> ttft_;
    std::shared_ptr<RequestBoard::Entry> entry_;  // what the status page shows of this request
};

void Gateway::responses(server::Exchange& ex) {
    struct Active {
        std::atomic<int>& n;
        metrics::Gauge& g = metrics::global().gauge("pulse_active_requests", "Responses requests in flight");
        explicit Active(std::atomic<int>& a) : n(a) {
            n.fetch_add(1);
            g.add(1);
        }
        ~Active() {
            n.fetch_sub(1);
            g.add(-1);
        }
    } active(active_);
    auto snap = snapshot();
    if (draining_) {
        ex.close_after();
        return send_error(ex, 503, "server_error", "the gateway is shutting down; retry shortly", {}, "draining", 1);
    }
    if (active_.load() > snap->cfg.server.max_streams) {
        // The server keeps spare workers so an over-capacity request still gets a clear answer.
        metrics::global().counter(metrics::kCapacityRejections.name, metrics::kCapacityRejections.help).add();
        return send_error(ex, 503, "server_error",
                          "the gateway is at capacity (" + std::to_string(snap->cfg.server.max_streams) +
                              " requests in flight, server.max_streams); retry shortly",
                          {}, "at_capacity", 1);
    }
    ResponseSession(*this, ex).run();
}

}  // namespace pulse::gateway
