// The status table (core/gateway/protocol/status_errors) against the contract the SDK header
// states beside each status code, and against what Codex does with each answer.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "gateway/protocol/status_errors.h"

using pulse::gateway::status_error;

TEST_CASE("every plugin status maps as pulse/plugin.h documents it") {
    struct Row {
        pulse_status_t s;
        int http;
        const char* code;
        bool retry_after;
        bool elsewhere;
    };
    // From the comments beside the PULSE_E_* definitions.
    const Row rows[] = {
        {PULSE_E_INVALID_ARGUMENT, 400, "invalid_request", false, false},
        {PULSE_E_UNSUPPORTED, 400, "invalid_request", false, false},
        {PULSE_E_UNAVAILABLE, 503, "backend_unavailable", true, true},
        {PULSE_E_RESOURCE_EXHAUSTED, 503, "backend_unavailable", true, true},
        {PULSE_E_CANCELLED, 502, "plugin_error", false, false},
        {PULSE_E_DEADLINE, 504, "timeout", true, false},  // the request's own deadline: another endpoint would not meet it either
        {PULSE_E_INTERNAL, 502, "plugin_error", false, false},
        {PULSE_E_ABI, 502, "plugin_error", false, false},
        {PULSE_E_CONTEXT_LENGTH, 400, "context_length_exceeded", false, false},
    };
    for (const Row& r : rows) {
        CAPTURE(r.s);
        const auto e = status_error(r.s);
        CHECK(e.http_status == r.http);
        CHECK(std::string(e.code) == r.code);
        CHECK((e.retry_after > 0) == r.retry_after);
        CHECK(e.elsewhere == r.elsewhere);
        CHECK(pulse::gateway::retryable(r.s) == r.elsewhere);
        CHECK(std::string(e.type) == (r.http < 500 ? "invalid_request_error" : "server_error"));
    }
}

TEST_CASE("no status becomes a 500, and only a context overflow is a context_length_exceeded event") {
    // Codex shows a 500 as "high demand" and drops its message; it compacts the conversation on
    // context_length_exceeded and retries the turn on any other response.failed code.
    for (int s = -64; s <= 0; ++s) {
        CAPTURE(s);
        const auto e = status_error(static_cast<pulse_status_t>(s));
        CHECK(e.http_status != 500);
        const bool overflow = s == PULSE_E_CONTEXT_LENGTH;
        CHECK(std::strcmp(e.event_code, overflow ? "context_length_exceeded" : "server_error") == 0);
    }
}
