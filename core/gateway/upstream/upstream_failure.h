// How a backend's failure is worded, the same for an HTTP endpoint (http_backend.cpp) and an
// in-process backend (plugin_backend.cpp): the client, the log and the status page read these.
#pragma once

#include <cstdio>
#include <string>

#include "gateway/upstream/upstream.h"

namespace pulse::gateway {

// A transport failure, before acceptance ("cannot reach") or after it ("broke mid-stream").
inline UpEvent upstream_failure(bool accepted, const std::string& what) {
    UpEvent e;
    e.kind = UpEvent::Kind::failed;
    e.status = PULSE_E_UNAVAILABLE;
    e.text = (accepted ? "the backend connection broke mid-stream: " : "cannot reach the backend: ") + what;
    return e;
}

// "0.5", "2", "300": a timeout as the config wrote it.
inline std::string seconds_text(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
}

}  // namespace pulse::gateway
