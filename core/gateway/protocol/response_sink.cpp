#include "gateway/protocol/response_sink.h"

#include <algorithm>

#include "http/error_body.h"

namespace pulse::gateway {

// Never 500: Codex hides a 500's message behind "high demand". A plugin's own failure
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

void ResponseSink::event(std::string_view type, std::string_view json) {
    events_ += "event: ";
    events_ += type;
    events_ += "\ndata: ";
    events_ += json;
    events_ += "\n\n";
}

void ResponseSink::header(std::string name, std::string value) {
    std::erase_if(headers_, [&](const auto& h) { return h.first == name; });
    headers_.emplace_back(std::move(name), std::move(value));
}

void ResponseSink::take(std::string& wire) {
    if (events_.empty()) return;
    if (!head_sent_) {
        head_sent_ = true;
        server::Headers h = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
        h.insert(h.end(), headers_.begin(), headers_.end());
        ex_.stream_head(wire, "text/event-stream", h);
    }
    ex_.frame(wire, events_);
    events_.clear();
}

bool ResponseSink::flush() {
    take(wire_);
    if (!wire_.empty() && !ex_.lost()) ex_.send(wire_);
    wire_.clear();
    return !ex_.lost();
}

bool ResponseSink::check_gone() {
    if (!ex_.lost() && ex_.client_gone()) ex_.give_up();
    return ex_.lost();
}

void ResponseSink::answer(int status, std::string body) {
    answer_status_ = status;
    answer_ = std::move(body);
}

void ResponseSink::error(pulse_status_t s, const std::string& message, const char* code, int retry_after_s) {
    const HttpError h = http_error_for(s);
    if (const int retry = h.retry_after ? std::max(h.retry_after, retry_after_s) : 0; retry > 0) header("Retry-After", std::to_string(retry));
    answer(h.status, http::error_body(h.type, message, {}, code ? code : h.code));
}

bool ResponseSink::end() {
    if (answer_) {
        ex_.respond(answer_status_, "application/json", *answer_, headers_);
        return !ex_.lost();
    }
    if (!head_sent_) return !ex_.lost();
    ex_.stream_end(wire_);
    return flush();
}

}  // namespace pulse::gateway
