// The one table from a plugin status (pulse_status_t) to what it means: what a client is told
// (docs/SDK.md, "Status codes": before any event, the HTTP status, the OpenAI error type and
// code and a Retry-After; once the stream is open, the code its response.failed event carries)
// and whether failover tries again.
#pragma once

#include <pulse/plugin.h>

namespace pulse::gateway {

struct StatusError {
    int http_status;
    const char* type;        // the OpenAI error type: invalid_request_error, server_error
    const char* code;        // the error body's code
    int retry_after;         // seconds of Retry-After; 0 = none (asking again gives the same answer)
    const char* event_code;  // response.failed's error.code: Codex compacts on context_length_exceeded
                             // and retries the turn on any other
    bool elsewhere;          // another endpoint, or another round of them, may answer differently:
                             // worth a failover; the rest give the same answer again
};

StatusError status_error(pulse_status_t s);

// Whether failover may try again after `s` (the table's `elsewhere`).
inline bool retryable(pulse_status_t s) { return status_error(s).elsewhere; }

}  // namespace pulse::gateway
