#include "gateway/request/attempt_recovery.h"

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"

namespace pulse::gateway {

bool drop_refused_budget(ResponseState& st, const EndpointRef& ep, const std::string& body) {
    const std::string field = st.budget->field;
    if (field.empty() || body.find(field) == std::string::npos) return false;
    st.req.doc["reasoning"].RemoveMember("budget_tokens");
    if (st.profile->build(st.builder.get()) != PULSE_OK) return false;
    const std::string why = "not enforced: endpoint " + ep.cfg->name + " refused " + field + " (" + body.substr(0, 160) + ")";
    log::warn("policy", st.id + ": reasoning budget " + std::to_string(st.budget->budget) + " " + why + "; sent again without it");
    st.budget->how = why;
    st.budget->field.clear();
    metrics::global()
        .counter("pulse_reasoning_budget_refused_total", "requests sent again without their reasoning budget because the backend refused it",
                 {{"model", st.req.model_id}, {"endpoint", ep.cfg->name}})
        .add();
    st.budget->enforced = false;
    st.sink.header("X-Pulse-Reasoning-Budget", st.budget->header());
    return true;
}

Resume resume_elsewhere(ResponseState& st, const EndpointRef& ep, const std::string& why) {
    // Bounded like any failover: the loop in serve() ends its rounds with the retry window.
    if (!st.req.rt->cfg->resume || !st.profile->can_resume() || st.gw.cutting() || st.sink.lost() || !st.builder->can_resume()) return Resume::impossible;
    // The answer already has every token the client allowed: it ends as an uninterrupted one
    // cut at that limit would, not with a continuation that would go past it.
    if (auto limit = st.req.output_limit(); limit && st.builder->spent().output >= *limit) {
        st.profile->finish(PULSE_STREAM_TRUNCATED, *st.builder);
        st.builder->begin_resume();  // drops the attempt's failure; its tokens count in the usage
        st.builder->finish(PULSE_FINISH_LENGTH);
        st.outcome = outcome_of(st.builder->end(PULSE_STREAM_CLEAN));
        log::warn("responses", st.id + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why + ") after the answer reached max_output_tokens (" +
                                   std::to_string(*limit) + "): it ends incomplete, as it would have there");
        return Resume::ended;
    }
    if (pulse_status_t rc = st.profile->resume(*st.builder); rc != PULSE_OK) {
        log::warn("responses", st.id + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why +
                                   "); the response cannot be resumed: " + st.profile->error(rc));
        return Resume::impossible;
    }
    st.gw.endpoint_failed(ep, why, /*real_request=*/true);
    st.builder->begin_resume();
    ++st.resumes;
    st.entry->resumed();
    metrics::global()
        .counter(metrics::kResumed.name, metrics::kResumed.help,
                 {{"model", st.req.model_id}, {"endpoint", ep.cfg->name}})
        .add();
    log::warn("responses", st.id + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why + "); resuming the response after " +
                               std::to_string(st.profile->resumed_from().first) + " bytes of text and " +
                               std::to_string(st.profile->resumed_from().second) + " of reasoning on the next endpoint, " + st.profile->resumed_by());
    return Resume::next_endpoint;
}

}  // namespace pulse::gateway
