#include "gateway/request/profile_session.h"

#include "gateway/snapshot.h"

namespace pulse::gateway {

ProfileSession::ProfileSession(const RequestPlan& req, const std::string& response_id)
    : req_(req), vt_(&req.rt->profile->registration.translation) {
    call_.request_id = response_id;
    call_.cancelled = &cancelled_;
    // The upstream request is about the size of the client's body: one buffer of that size up
    // front, rather than growing by half again each time it fills (a large body then peaked at
    // its own size plus two copies of the upstream request while one was moved).
    upreq_.body.buffer.Reserve(req.body_bytes + 4096);
}

ProfileSession::~ProfileSession() {
    if (stream_) vt_->stream_close(stream_);
}

const std::string& ProfileSession::profile_name() const { return req_.rt->profile->registration.name; }

std::string ProfileSession::error(pulse_status_t rc) const { return host::call_error(call_, rc, req_.rt->profile->plugin_id()); }

pulse_status_t ProfileSession::unusable(const char* what, const pulse_upstream_req& r) {
    call_.message = "profile '" + profile_name() + "' wrote an unusable " + what + ": " + r.body.incomplete_reason();
    call_.has_message = true;
    return PULSE_E_INTERNAL;
}

pulse_status_t ProfileSession::prepare() {
    if (!PULSE_HAS_FIELD(vt_, pulse_translation_vt_t, prepare) || !vt_->prepare) return PULSE_OK;
    auto r = std::make_unique<pulse_upstream_req>();
    call_.reset();
    r->body.call = &call_;
    pulse_status_t rc = vt_->prepare(req_.rt->instance, &call_, host::view(&req_.doc), host::view(&req_.rt->view), r.get());
    r->body.call = nullptr;
    if (rc == PULSE_OK && r->path_set && !r->body.complete()) rc = unusable("preparatory request", *r);
    if (rc == PULSE_OK && r->path_set) prep_ = std::move(r);
    return rc;
}

bool ProfileSession::set_prepared(const std::string& answer) {
    if (prepared_.Parse(answer.c_str(), answer.size()).HasParseError()) {
        prepared_.SetNull();
        return false;
    }
    upreq_.prepared = host::view(&prepared_);
    return true;
}

pulse_status_t ProfileSession::build(ResponseBuilder* builder) {
    if (built_) upreq_.reset();  // written once more (keeps what was prepared)
    built_ = false;
    call_.reset();
    upreq_.body.call = &call_;
    pulse_status_t rc = vt_->build_request(req_.rt->instance, &call_, host::view(&req_.doc), host::view(&req_.rt->view), &upreq_);
    upreq_.body.call = nullptr;
    if (rc == PULSE_OK && !upreq_.body.complete()) rc = unusable("upstream request", upreq_);
    if (rc == PULSE_OK) rc = open_stream(builder);
    if (rc == PULSE_OK) built_ = true;
    return rc;
}

pulse_status_t ProfileSession::restart(ResponseBuilder* builder) { return open_stream(builder); }

pulse_status_t ProfileSession::resume(ResponseBuilder& builder) {
    const bool was = resuming_;
    resuming_ = true;
    pulse_status_t rc = open_stream(&builder);
    if (rc != PULSE_OK) resuming_ = was;
    return rc;
}

pulse_status_t ProfileSession::open_stream(ResponseBuilder* builder) {
    void* fresh = nullptr;
    call_.reset();
    pulse_status_t rc = resuming_ ? open_resume_stream(*builder, &fresh) : vt_->stream_open(req_.rt->instance, &call_, host::view(&req_.doc), &fresh);
    if (rc != PULSE_OK) return rc;
    if (stream_) vt_->stream_close(stream_);
    stream_ = fresh;
    if (!resuming_ && builder) builder->restart_trail();
    return rc;
}

pulse_status_t ProfileSession::open_resume_stream(ResponseBuilder& builder, void** fresh) {
    auto point = builder.resume_point();
    if (!point) {
        call_.message = "the response showed a tool call: it cannot be continued";
        call_.has_message = true;
        return PULSE_E_UNSUPPORTED;
    }
    resumed_from_ = {point->text.size(), point->reasoning.size()};
    rapidjson::Document partial(rapidjson::kObjectType);
    auto& a = partial.GetAllocator();
    auto text = [&](const std::string& s) { return rapidjson::Value(s.c_str(), static_cast<rapidjson::SizeType>(s.size()), a); };
    partial.AddMember("text", text(point->text), a);
    partial.AddMember("reasoning", text(point->reasoning), a);
    // What the earlier attempts spent, so the continuation asks only for what is left of the
    // request's limits (max_output_tokens, a reasoning budget).
    const auto spent = builder.spent();
    partial.AddMember("output_tokens", rapidjson::Value(spent.output), a);
    partial.AddMember("reasoning_tokens", rapidjson::Value(spent.reasoning), a);
    // The token record, so that the backend continues from the very tokens (not the text).
    resumed_by_ = point->trail ? "by tokens" : "by text (" + (point->no_trail.empty() ? "the backend reports no token ids" : point->no_trail) + ")";
    if (point->trail) {
        rapidjson::Value ids(rapidjson::kArrayType), trail(rapidjson::kObjectType);
        ids.Reserve(static_cast<rapidjson::SizeType>(point->trail->first.size()), a);
        for (int32_t id : point->trail->first) ids.PushBack(id, a);
        trail.AddMember("tokens", ids, a);
        trail.AddMember("raw", text(point->trail->second), a);
        partial.AddMember("trail", trail, a);
    }
    auto r = std::make_unique<pulse_upstream_req>();
    r->prepared = upreq_.prepared;
    r->body.call = &call_;
    pulse_status_t rc = vt_->resume(req_.rt->instance, &call_, host::view(&req_.doc), host::view(&req_.rt->view), host::view(&partial), r.get(), fresh);
    r->body.call = nullptr;
    if (rc == PULSE_OK && !r->body.complete()) rc = unusable("resume request", *r);
    if (rc != PULSE_OK) {
        if (*fresh) vt_->stream_close(*fresh);
        *fresh = nullptr;
        return rc;
    }
    // The profile says how it continued (it may go by text even with a record).
    if (auto n = r->notes.find("resume"); n != r->notes.end()) resumed_by_ = n->second;
    if (resumed_by_.rfind("by text", 0) == 0) resumed_by_ += ": re-tokenized there, a greedy answer may differ after the seam";
    resume_req_ = std::move(r);
    return PULSE_OK;
}

pulse_status_t ProfileSession::feed(std::string_view chunk, ResponseBuilder& builder) {
    call_.reset();
    return vt_->stream_feed(stream_, &call_, {chunk.data(), chunk.size()}, &builder);
}

pulse_status_t ProfileSession::finish(pulse_stream_end_t how, ResponseBuilder& builder) {
    call_.reset();
    return vt_->stream_finish(stream_, &call_, how, &builder);
}

pulse_status_t ProfileSession::map_error(int http_status, std::string_view body, std::optional<std::string>* message) {
    call_.reset();
    pulse_status_t s = vt_->map_error ? vt_->map_error(req_.rt->instance, &call_, http_status, pulse_str_t{body.data(), body.size()})
                                      : (http_status >= 500 || http_status == 429 ? PULSE_E_UNAVAILABLE : PULSE_E_INVALID_ARGUMENT);
    if (call_.has_message) *message = call_.message;
    return s;
}

}  // namespace pulse::gateway
