// The translation profile's side of one /v1/responses request: every call the host makes into
// the profile's vtable for it (prepare, build_request, stream_open / feed / finish, resume,
// map_error), the upstream request the profile wrote, the continuation request while the
// response is being resumed, and the profile stream that reads the backend's answer.
//
// A call that returns a status other than PULSE_OK leaves its message in error(). Everything
// here runs on the thread that drives the request (or on the stream loop while it relays),
// never on two at once.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <rapidjson/document.h>

#include "gateway/protocol/response_builder.h"
#include "gateway/request/request_plan.h"
#include "plugin/host_api.h"

namespace pulse::gateway {

class ProfileSession {
public:
    ProfileSession(const RequestPlan& req, const std::string& response_id);
    ~ProfileSession();
    ProfileSession(const ProfileSession&) = delete;
    ProfileSession& operator=(const ProfileSession&) = delete;

    // SDK 1.3: asks the profile whether it needs an answer from the backend before it can
    // write the request (preparatory() is then that request).
    pulse_status_t prepare();
    const pulse_upstream_req* preparatory() const { return prep_.get(); }
    // The backend's answer to the preparatory request; false when it is not JSON.
    bool set_prepared(const std::string& answer);

    // Writes the upstream request (from the request plan's document as it is now) and opens
    // the stream that reads its answer. Again after the document changed (a refused budget).
    pulse_status_t build(ResponseBuilder* builder);
    bool built() const { return built_; }

    // A fresh stream for the next attempt: the request's own, or while resuming, one for a new
    // continuation of what the client has. On failure the current stream stays.
    pulse_status_t restart(ResponseBuilder* builder);
    // Continues the response from what `builder` shows (its text, reasoning, token record):
    // the resume request and its stream. On failure nothing changes (not resuming).
    pulse_status_t resume(ResponseBuilder& builder);
    bool resuming() const { return resuming_; }
    bool can_resume() const { return vt_->resume != nullptr; }
    // The last resume: bytes of text and of reasoning it continued after, and how ("by
    // tokens", or "by text (why): ...").
    std::pair<size_t, size_t> resumed_from() const { return resumed_from_; }
    const std::string& resumed_by() const { return resumed_by_; }

    pulse_status_t feed(std::string_view chunk, ResponseBuilder& builder);
    pulse_status_t finish(pulse_stream_end_t how, ResponseBuilder& builder);
    // The profile's reading of an HTTP error answer; its message (if any) in `message`.
    pulse_status_t map_error(int http_status, std::string_view body, std::optional<std::string>* message);

    // What goes upstream now: the request, or while resuming the request that continues it.
    const pulse_upstream_req& active() const { return resuming_ ? *resume_req_ : upreq_; }
    const pulse_upstream_req& request() const { return upreq_; }
    // The message of the last failed call, as the log and the client see it.
    std::string error(pulse_status_t rc) const;
    const std::string& profile_name() const;
    std::atomic<bool>& cancelled() { return cancelled_; }

private:
    pulse_status_t open_stream(ResponseBuilder* builder);
    pulse_status_t open_resume_stream(ResponseBuilder& builder, void** fresh);
    pulse_status_t unusable(const char* what, const pulse_upstream_req& r);

    const RequestPlan& req_;
    const pulse_translation_vt_t* vt_;
    std::atomic<bool> cancelled_{false};
    pulse_call call_;
    pulse_upstream_req upreq_;
    void* stream_ = nullptr;
    bool built_ = false;
    bool resuming_ = false;
    std::unique_ptr<pulse_upstream_req> resume_req_;  // the request that continues the response (resuming_)
    std::unique_ptr<pulse_upstream_req> prep_;        // the preparatory request (SDK 1.3), if any
    rapidjson::Document prepared_;                    // its answer, once an endpoint gave it
    std::pair<size_t, size_t> resumed_from_;
    std::string resumed_by_;
};

}  // namespace pulse::gateway
