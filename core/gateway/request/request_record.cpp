#include "gateway/request/request_record.h"

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"

namespace pulse::gateway {

using namespace std::chrono;

const char* name(Outcome o) {
    switch (o) {
        case Outcome::none: return "error";
        case Outcome::completed: return "completed";
        case Outcome::incomplete: return "incomplete";
        case Outcome::failed: return "failed";
        case Outcome::unavailable: return "unavailable";
        case Outcome::rejected: return "rejected";
        case Outcome::invalid: return "invalid";
        case Outcome::cancelled: return "cancelled";
        case Outcome::client_lost: return "client_lost";
    }
    return "error";
}

Outcome outcome_of(ResponseBuilder::Ending e) {
    return e == ResponseBuilder::Ending::completed ? Outcome::completed : e == ResponseBuilder::Ending::incomplete ? Outcome::incomplete : Outcome::failed;
}

void record(const RequestRecord& r, RequestBoard& board, const std::shared_ptr<RequestBoard::Entry>& entry, const std::string& trace_file) {
    if (!trace_file.empty() && r.builder && r.builder->ended()) trace(trace_file, r.id, "response", r.builder->final_response());
    auto& reg = metrics::global();
    const std::string ep = r.served_by.empty() ? "-" : r.served_by;
    reg.counter(metrics::kRequests.name, metrics::kRequests.help,
                {{"model", r.model_id}, {"endpoint", ep}, {"outcome", name(r.outcome)}})
        .add();
    double total_s = duration<double>(steady_clock::now() - r.t0).count();
    reg.histogram("pulse_request_duration_seconds", "whole request, receipt to last byte", {{"model", r.model_id}}).observe(total_s);
    if (r.ttft) reg.histogram(metrics::kTtft.name, metrics::kTtft.help, {{"model", r.model_id}}).observe(r.ttft->count() / 1000.0);
    ResponseBuilder::Usage u;
    if (r.builder) u = r.builder->usage_totals();
    reg.counter("pulse_input_tokens_total", "prompt tokens reported by backends", {{"model", r.model_id}}).add(static_cast<uint64_t>(u.input));
    reg.counter("pulse_cached_tokens_total", "prompt tokens served from the backend prefix cache", {{"model", r.model_id}})
        .add(static_cast<uint64_t>(u.cached));
    reg.counter("pulse_output_tokens_total", "output tokens reported by backends", {{"model", r.model_id}}).add(static_cast<uint64_t>(u.output));
    if (r.budget && r.builder && r.builder->ended()) {
        reg.counter("pulse_reasoning_budget_tokens_total", "reasoning budgets of finished requests that had one, summed", {{"model", r.model_id}})
            .add(static_cast<uint64_t>(r.budget->budget));
        reg.counter("pulse_budgeted_reasoning_tokens_total", "reasoning tokens of finished requests that had a budget", {{"model", r.model_id}})
            .add(static_cast<uint64_t>(u.reasoning));
        if (u.reasoning > r.budget->budget)
            reg.counter("pulse_reasoning_over_budget_total", "finished requests whose reasoning went past their budget", {{"model", r.model_id}})
                .add();
    }
    // in/cached are "-" when no backend reported usage (a stream that failed or was cancelled
    // before its last chunk); out then counts the deltas that reached the client.
    const auto known = [&](int64_t v) { return u.reported ? std::to_string(v) : std::string("-"); };
    const int64_t out = r.builder ? r.builder->spent().output : 0;
    RequestBoard::Ended ended;
    ended.outcome = name(r.outcome);
    ended.ttft_ms = r.ttft ? r.ttft->count() : -1;
    ended.total_ms = duration_cast<milliseconds>(steady_clock::now() - r.t0).count();
    ended.input = u.reported ? u.input : -1;
    ended.cached = u.reported ? u.cached : -1;
    ended.output = out;
    ended.budget = r.budget ? r.budget->budget : -1;
    ended.budget_enforced = r.budget && r.budget->enforced;
    board.end(entry, ended);
    log::info("responses", r.id + " model=" + r.model_id + " endpoint=" + ep + " outcome=" + name(r.outcome) + " in=" + known(u.input) +
                               " cached=" + known(u.cached) + " out=" + std::to_string(out) +
                               " ttft_ms=" + (r.ttft ? std::to_string(r.ttft->count()) : "-") +
                               (r.resumes ? " resumed=" + std::to_string(r.resumes) : std::string()) +
                               " total_ms=" + std::to_string(duration_cast<milliseconds>(steady_clock::now() - r.t0).count()));
}

}  // namespace pulse::gateway
