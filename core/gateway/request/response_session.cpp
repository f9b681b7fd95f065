// POST /v1/responses, from receipt to the last byte (docs/ARCHITECTURE.md, "One request, file
// by file"). The session is the request's outline: plan it (request_plan), translate it
// (profile_session), let the failover plan (failover) choose endpoints while the attempt
// driver (attempt) serves one at a time, then end the response (response_sink) and record it
// (request_record). The state they share is response_state.
#include "gateway/request/response_session.h"

#include <algorithm>
#include <chrono>

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"
#include "common/wakeup.h"
#include "gateway/protocol/http_util.h"
#include "gateway/protocol/status_errors.h"
#include "gateway/request/attempt.h"
#include "gateway/request/failover.h"
#include "gateway/request/response_state.h"

namespace pulse::gateway {
namespace {

using namespace std::chrono;

class ResponseSession {
public:
    ResponseSession(RequestContext& gw, server::Exchange& ex) : st_(gw, ex) {}

    void run() {
        if (read_and_validate() && (apply_policy(st_.req, st_.id), translate())) {
            report_budget();
            serve();
        }
        finish();
    }

private:
    bool read_and_validate() {
        if (auto e = plan_request(st_.ex.body(), *st_.snap, st_.id, st_.req)) return invalid(*e);
        st_.entry = st_.gw.board().begin(st_.id, st_.req.model_id, st_.req.streaming);
        return true;
    }

    // A reasoning budget (from the policy, or the client's reasoning.budget_tokens) is reported
    // as the profile applied it: enforced by the backend, or not (a header and a log line).
    void report_budget() {
        st_.budget = budget_report(st_.req, st_.profile->request().notes);
        if (!st_.budget) return;
        st_.sink.header("X-Pulse-Reasoning-Budget", st_.budget->header());
        metrics::global()
            .counter("pulse_reasoning_budget_requests_total", "requests with a reasoning budget, by whether the backend enforces it",
                     {{"model", st_.req.model_id}, {"enforced", st_.budget->enforced ? "yes" : "no"}})
            .add();
        if (!st_.budget->enforced) log::warn("policy", st_.id + ": reasoning budget " + std::to_string(st_.budget->budget) + " " + st_.budget->how);
    }

    bool invalid(const RequestError& e) {
        st_.ex.close_after();  // a client that sent garbage gets no second chance on this connection
        metrics::global().counter("pulse_invalid_requests_total", "requests refused with a 4xx before translation", {{"code", e.code}}).add();
        send_error(st_.ex, e.http_status, "invalid_request_error", e.message, e.param, e.code);
        st_.outcome = Outcome::invalid;
        return false;
    }

    bool translate() {
        st_.profile = std::make_unique<ProfileSession>(st_.req, st_.id);
        // SDK 1.3: a profile that needs an answer from the backend first has its request built
        // at the first attempt on an HTTP endpoint, once that answer is in (prepare_on).
        if (pulse_status_t rc = st_.profile->prepare(); rc != PULSE_OK) return st_.refused_by_profile(rc);
        if (!st_.profile->preparatory())
            if (pulse_status_t rc = st_.profile->build(nullptr); rc != PULSE_OK) return st_.refused_by_profile(rc);
        st_.builder = std::make_unique<ResponseBuilder>(st_.id, st_.req.model_id, st_.req.rt->reasoning, [this](std::string_view type, std::string_view json) {
            if (!st_.req.streaming) return;
            st_.last_event = steady_clock::now();
            st_.sink.event(type, json);
        });
        st_.keepalive = milliseconds(static_cast<int64_t>(st_.cfg.upstream.keepalive_s * 1000));
        return true;
    }

    // Waits before the next round, keeping the client alive: asleep until the backoff ends, the
    // next keepalive is due, the client hangs up or the drain cut comes, whichever is first.
    void wait_backoff(steady_clock::duration d) {
        st_.entry->waiting();
        const auto until = steady_clock::now() + d;
        while (!st_.sink.lost() && !st_.gw.cutting() && steady_clock::now() < until) {
            const auto keepalive = st_.req.streaming ? st_.last_event + st_.keepalive : steady_clock::time_point::max();
            st_.sink.wait_gone(std::min(until, keepalive), st_.gw.cut_signal().fd());
            st_.keepalive_if_due();
        }
    }

    // The failover loop: the plan says which endpoint next, when to wait, when to give up.
    void serve() {
        const size_t regular = static_cast<size_t>(
            std::count_if(st_.req.rt->endpoints.begin(), st_.req.rt->endpoints.end(), [](const EndpointRef& e) { return !e.cfg->last_resort; }));
        bool first_round = true;
        FailoverPlan plan(regular, st_.req.rt->last_resorts(), [&] {
            auto order = st_.req.rt->order(st_.req.conversation);
            if (first_round && st_.req.rt->cfg->routing == config::Model::Routing::sticky && !order.empty() && order.front() != st_.req.rt->home(st_.req.conversation))
                metrics::global()
                    .counter("pulse_sticky_moved_total", "sticky requests that started away from their conversation's endpoint (it was down)",
                             {{"model", st_.req.model_id}})
                    .add();
            first_round = false;
            // A misconfigured endpoint (endpoint_health.h) answers every request the same way:
            // it is left out of the rounds until its setup is fixed.
            std::erase_if(order, [&](size_t i) { return st_.req.rt->endpoints[i].health->misconfigured(); });
            return order;
        }, st_.t0 + duration_cast<steady_clock::duration>(duration<double>(st_.cfg.upstream.retry_window_s)));
        AttemptDriver driver(st_, plan);
        while (!st_.sink.lost() && !st_.gw.cutting()) {
            if (every_endpoint_misconfigured()) break;  // no round can help: answered at once
            const auto step = plan.next({steady_clock::now(), st_.req.rt->regular_healthy(), retryable(st_.last_status)});
            if (step.kind == FailoverPlan::Step::Kind::give_up) {
                if (step.refused_for_good) {
                    st_.last_status = PULSE_E_INVALID_ARGUMENT;
                    st_.last_error = plan.deterministic_error();
                }
                break;
            }
            if (step.kind == FailoverPlan::Step::Kind::wait) {
                wait_backoff(step.wait);
                continue;
            }
            if (step.last_resort) {
                to_last_resort(st_.req.rt->endpoints[step.endpoint], step.last_resort);
            } else if (step.count != FailoverPlan::Step::Count::first) {
                if (!st_.builder->has_output()) st_.entry->failover();  // a resume's move is counted as one
                const bool retry = step.count == FailoverPlan::Step::Count::retry;
                metrics::global()
                    .counter(retry ? metrics::kRetries.name : metrics::kFailovers.name, retry ? metrics::kRetries.help : metrics::kFailovers.help,
                             {{"model", st_.req.model_id}})
                    .add();
            }
            plan.attempted(driver.run(step.endpoint) == AttemptDriver::Result::retry);
        }
        if (st_.sink.lost() && st_.outcome == Outcome::none) st_.outcome = Outcome::cancelled;
    }

    bool every_endpoint_misconfigured() {
        const auto& eps = st_.req.rt->endpoints;
        if (eps.empty() || !std::all_of(eps.begin(), eps.end(), [](const EndpointRef& e) { return e.health->misconfigured(); })) return false;
        st_.misconfigured = true;
        return true;
    }

    // Every endpoint's own failure, for the client: the last one alone can hide the cause (a
    // misconfigured first endpoint behind a second one that is simply down).
    std::string failures_text() const {
        std::string out;
        for (const auto& e : st_.req.rt->endpoints) {
            std::string why;
            if (auto it = st_.failures.find(e.cfg->name); it != st_.failures.end()) why = it->second;
            else if (!e.health->healthy()) why = e.health->last_error();
            else continue;
            out += (out.empty() ? "" : "; ") + e.cfg->name + ": " + why;
        }
        return out;
    }

    // The request goes to a last-resort endpoint (the plan allows it once per request), marked
    // in the response head (X-Pulse-Fallback), the log and pulse_last_resort_requests_total.
    void to_last_resort(const EndpointRef& ep, const char* reason) {
        const char* why = std::string_view(reason) == "all_down" ? "every other endpoint is down"
                                                                  : "no other endpoint took the request within the retry window";
        log::warn("responses", st_.id + ": served by the last-resort endpoint " + ep.cfg->name + ": " + why);
        metrics::global()
            .counter("pulse_last_resort_requests_total", "requests sent to a last-resort endpoint because no other could serve them",
                     {{"model", st_.req.model_id}, {"endpoint", ep.cfg->name}, {"reason", reason}})
            .add();
        st_.sink.header("X-Pulse-Fallback", "last-resort; endpoint=" + ep.cfg->name);
    }

    // The response's end: the terminal event or the error, the request's record (trace,
    // metrics, log), then the last bytes. A client that saw the end sees its accounting.
    void finish() {
        if (st_.outcome == Outcome::invalid) return;  // answered and counted
        if (st_.outcome == Outcome::none || st_.outcome == Outcome::rejected) {
            // Only a request that went through the failover rounds spent the window; a profile
            // that refused it (outcome rejected) was answered at once, whatever its status.
            const bool window_spent = st_.outcome == Outcome::none && retryable(st_.last_status);
            if (st_.outcome == Outcome::none) st_.outcome = window_spent ? Outcome::unavailable : Outcome::rejected;
            std::string msg = st_.gw.cutting() ? st_.last_error
                              : st_.misconfigured ? "every endpoint of model '" + st_.req.model_id + "' is misconfigured: " + failures_text()
                              : window_spent ? "no backend could take the request within " +
                                                   std::to_string(static_cast<int>(st_.cfg.upstream.retry_window_s)) + " s; last error: " + st_.last_error
                                             : st_.last_error;
            if (window_spent && !st_.misconfigured && !st_.gw.cutting() && st_.req.rt->endpoints.size() > 1)
                if (std::string each = failures_text(); each.find("; ") != std::string::npos) msg += " (each endpoint: " + each + ")";
            if (st_.req.streaming && st_.builder && st_.builder->started())
                st_.builder->fail(st_.last_status, msg);  // SSE already open (keepalives): a terminal event
            else
                st_.sink.error(st_.last_status, msg, st_.retry_after_s);
        } else if (!st_.req.streaming && st_.outcome != Outcome::cancelled) {
            if (auto f = st_.builder->failure(); f && !st_.builder->has_output())
                st_.sink.error(f->first, f->second, st_.retry_after_s);
            else
                st_.sink.answer(200, st_.builder->final_response());
        }
        // Everything but the very end leaves first, so a client that stopped reading is known
        // before the request is recorded.
        if (st_.req.streaming && !st_.sink.has_answer() && st_.outcome != Outcome::cancelled && !st_.sink.lost()) st_.sink.flush();
        if (st_.sink.lost() && st_.outcome != Outcome::cancelled) st_.outcome = Outcome::client_lost;
        record();
        if (st_.outcome == Outcome::cancelled || st_.outcome == Outcome::client_lost) return;
        if (!st_.sink.end()) log::warn("responses", st_.id + ": the client did not take the end of the response (" + name(st_.outcome) + ")");
    }

    void record() {
        gateway::record({st_.id, st_.req.model_id, st_.served_by, st_.outcome, st_.t0, st_.ttft, st_.resumes, st_.builder.get(), st_.budget ? &*st_.budget : nullptr}, st_.gw.board(),
                        st_.entry, st_.cfg.server.trace_file);
    }

    ResponseState st_;
};

}  // namespace

void serve_response(RequestContext& gw, server::Exchange& ex) { ResponseSession(gw, ex).run(); }

}  // namespace pulse::gateway
