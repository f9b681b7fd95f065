#include "gateway/upstream/backend_dialect.h"

#include <rapidjson/document.h>

#include "common/log.h"
#include "gateway/snapshot.h"
#include "plugin/host_api.h"

namespace pulse::gateway {

// Keeps only what a replay's answer says about its prompt.
struct BackendDialect::UsageReader::Sink final : pulse_delta_sink {
    int64_t input = 0, cached = 0;
    pulse_status_t text(std::string_view) override { return PULSE_OK; }
    pulse_status_t reasoning(std::string_view) override { return PULSE_OK; }
    pulse_status_t tool_begin(uint32_t, pulse_tool_kind_t, std::string_view, std::string_view, std::string_view) override { return PULSE_OK; }
    pulse_status_t tool_args(uint32_t, std::string_view) override { return PULSE_OK; }
    pulse_status_t tool_end(uint32_t) override { return PULSE_OK; }
    pulse_status_t finish(pulse_finish_t) override { return PULSE_OK; }
    pulse_status_t error(pulse_status_t, std::string_view) override { return PULSE_OK; }
    pulse_status_t usage(const pulse_usage_t& u) override {
        if (u.input_tokens > 0) {
            input = u.input_tokens;
            cached = std::clamp<int64_t>(u.cached_tokens, 0, u.input_tokens);
        }
        return PULSE_OK;
    }
};

BackendDialect::BackendDialect(const ModelRuntime& rt, std::shared_ptr<const Snapshot> keep)
    : keep_(std::move(keep)), rt_(&rt), vt_(&rt.profile->registration.translation) {}

const std::string& BackendDialect::profile() const {
    static const std::string none = "(none)";
    return rt_ ? rt_->profile->registration.name : none;
}

std::string BackendDialect::message(const pulse_call& call, pulse_status_t rc) const {
    return host::call_error(call, rc, rt_->profile->plugin_id());
}

std::unique_ptr<pulse_upstream_req> BackendDialect::warm_request(std::string_view sent) const {
    if (!warms()) return nullptr;
    rapidjson::Document doc;
    if (doc.Parse(sent.data(), sent.size()).HasParseError() || !doc.IsObject()) return nullptr;
    auto req = std::make_unique<pulse_upstream_req>();
    pulse_call call;
    req->body.call = &call;
    pulse_status_t rc = vt_->warm_request(rt_->instance, &call, host::view(&doc), req.get());
    req->body.call = nullptr;
    if (rc != PULSE_OK) {
        log::warn("warmup", "profile '" + profile() + "' wrote no replay: " + message(call, rc));
        return nullptr;
    }
    if (!req->path_set) return nullptr;  // not replayed, by the profile's choice
    if (!req->body.complete()) {
        log::warn("warmup", "profile '" + profile() + "' wrote an unusable replay: " + req->body.incomplete_reason());
        return nullptr;
    }
    return req;
}

std::unique_ptr<BackendDialect::UsageReader> BackendDialect::read_usage() const {
    auto r = std::make_unique<UsageReader>();
    r->sink_ = std::make_unique<UsageReader::Sink>();
    rapidjson::Document empty(rapidjson::kObjectType);
    pulse_call call;
    if (vt_ && vt_->stream_open(rt_->instance, &call, host::view(&empty), &r->stream_) == PULSE_OK) r->vt_ = vt_;
    else r->stream_ = nullptr;
    return r;
}

BackendDialect::UsageReader::~UsageReader() {
    if (stream_) vt_->stream_close(stream_);
}

void BackendDialect::UsageReader::feed(std::string_view chunk) {
    if (!stream_) return;
    pulse_call call;
    vt_->stream_feed(stream_, &call, {chunk.data(), chunk.size()}, sink_.get());  // a chunk it cannot read says nothing of usage
}

void BackendDialect::UsageReader::finish(bool clean) {
    if (!stream_) return;
    pulse_call call;
    vt_->stream_finish(stream_, &call, clean ? PULSE_STREAM_CLEAN : PULSE_STREAM_CANCELLED, sink_.get());
}

int64_t BackendDialect::UsageReader::input() const { return sink_->input; }
int64_t BackendDialect::UsageReader::cached() const { return sink_->cached; }

std::unique_ptr<pulse_upstream_req> BackendDialect::cache_request(pulse_cache_op_t op, int slot, const std::string& file, pulse_status_t* status,
                                                                  std::string* why) const {
    *status = PULSE_E_UNSUPPORTED;
    if (!persists()) return nullptr;
    auto req = std::make_unique<pulse_upstream_req>();
    pulse_call call;
    req->body.call = &call;
    *status = vt_->cache_request(rt_->instance, &call, op, slot, {file.data(), file.size()}, req.get());
    req->body.call = nullptr;
    if (*status == PULSE_OK && (!req->path_set || (!req->body.text().empty() && !req->body.complete()))) {
        call.message = "profile '" + profile() + "' wrote an unusable cache request" +
                       (req->path_set ? ": " + req->body.incomplete_reason() : std::string(" (no path)"));
        call.has_message = true;
        *status = PULSE_E_INTERNAL;
    }
    if (*status != PULSE_OK) {
        *why = message(call, *status);
        return nullptr;
    }
    return req;
}

pulse_status_t BackendDialect::cache_answer(pulse_cache_op_t op, int http_status, std::string_view body, int* count, std::string* why) const {
    if (!persists()) return PULSE_E_UNSUPPORTED;
    pulse_call call;
    int32_t n = 0;
    pulse_status_t rc = vt_->cache_answer(rt_->instance, &call, op, http_status, {body.data(), body.size()}, &n);
    if (rc == PULSE_OK && count) *count = n;
    if (rc != PULSE_OK) *why = message(call, rc);
    return rc;
}

std::string BackendDialect::probe(int http_status, std::string_view body, const std::string& target) const {
    const std::string generic = "probe GET " + target + " answered HTTP " + std::to_string(http_status);
    if (!vt_ || !vt_->probe_answer) return http_status == 200 ? std::string() : generic;
    pulse_call call;
    pulse_status_t rc = vt_->probe_answer(rt_->instance, &call, http_status, {body.data(), body.size()});
    if (rc == PULSE_OK) return {};
    if (rc == PULSE_NOT_READY) return "loading: " + (call.has_message ? call.message : std::string("the backend is starting"));
    return call.has_message ? generic + ": " + call.message : generic;
}

}  // namespace pulse::gateway
