#include "gateway/protocol/response_sink.h"

#include <algorithm>

#include "gateway/protocol/status_errors.h"
#include "http/error_body.h"

namespace pulse::gateway {

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

bool ResponseSink::wait_gone(std::chrono::steady_clock::time_point until, int wake_fd) {
    if (!ex_.lost() && ex_.wait_client_gone(until, wake_fd)) ex_.give_up();
    return ex_.lost();
}

void ResponseSink::answer(int status, std::string body) {
    answer_status_ = status;
    answer_ = std::move(body);
}

void ResponseSink::error(pulse_status_t s, const std::string& message, int retry_after_s) {
    const StatusError e = status_error(s);
    if (const int retry = e.retry_after ? std::max(e.retry_after, retry_after_s) : 0; retry > 0) header("Retry-After", std::to_string(retry));
    answer(e.http_status, http::error_body(e.type, message, {}, e.code));
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
