#include "gateway/protocol/status_errors.h"

namespace pulse::gateway {

// Never 500: Codex hides a 500's message behind "high demand". A plugin's own failure
// (INTERNAL, ABI, CANCELLED while the client is still there) is a 502 that says what failed,
// with no Retry-After: asking again gives the same answer.
StatusError status_error(pulse_status_t s) {
    switch (s) {
        case PULSE_E_INVALID_ARGUMENT:
        case PULSE_E_UNSUPPORTED: return {400, "invalid_request_error", "invalid_request", 0, "server_error", false};
        case PULSE_E_CONTEXT_LENGTH: return {400, "invalid_request_error", "context_length_exceeded", 0, "context_length_exceeded", false};
        case PULSE_E_UNAVAILABLE:
        case PULSE_E_RESOURCE_EXHAUSTED: return {503, "server_error", "backend_unavailable", 1, "server_error", true};
        case PULSE_E_DEADLINE: return {504, "server_error", "timeout", 1, "server_error", false};
        case PULSE_E_INTERNAL:
        case PULSE_E_ABI:
        case PULSE_E_CANCELLED: return {502, "server_error", "plugin_error", 0, "server_error", false};
        default: return {502, "server_error", "bad_gateway", 1, "server_error", false};
    }
}

}  // namespace pulse::gateway
