#include "gateway/background/endpoint_health.h"

namespace pulse::gateway {

bool EndpointHealth::mark_healthy(bool real_request) {
    if (real_request) {
        request_failures_ = 0;
        misconfigured_ = false;
    } else if (request_failures_.load() >= kFailureRun || misconfigured_.load()) {
        return false;
    }
    if (healthy_.exchange(true)) return false;
    std::lock_guard lock(m_);
    since_ = std::chrono::steady_clock::now();
    return true;
}

bool EndpointHealth::mark_unhealthy(const std::string& why, bool real_request) {
    if (real_request) ++request_failures_;
    std::lock_guard lock(m_);
    last_error_ = why;
    if (!healthy_.exchange(false)) return false;
    since_ = std::chrono::steady_clock::now();
    return true;
}

void EndpointHealth::set_detail(std::string json) {
    std::lock_guard lock(m_);
    detail_ = std::move(json);
}

std::string EndpointHealth::detail() const {
    std::lock_guard lock(m_);
    return detail_;
}

std::string EndpointHealth::last_error() const {
    std::lock_guard lock(m_);
    return last_error_;
}

double EndpointHealth::seconds_in_state() const {
    std::lock_guard lock(m_);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
}

}  // namespace pulse::gateway
