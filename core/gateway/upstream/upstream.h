// How the gateway talks to a backend: an HTTP endpoint (vLLM, llama-server) is sent the
// request (send_http); an in-process backend plugin is started (BackendInstance::open). Either
// way the answer is a DetachedBody that the stream loop reads without blocking, producing the
// same UpEvents, so keepalive, deadlines, cancellation, failover and resume are one piece of
// code (the stream loop, and AttemptDriver::on_event).
#pragma once

#include <pulse/plugin.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "gateway/upstream/backend_dialect.h"
#include "http/client.h"
#include "plugin/host_api.h"
#include "plugin/plugin_manager.h"

namespace pulse::gateway {

class Liveness;

struct UpEvent {
    enum class Kind {
        timeout,   // nothing within the wait; the caller may send a keepalive and ask again
        accepted,  // the backend took the request (HTTP 200 / stream_start succeeded)
        rejected,  // the backend refused it: `http_status` + `text` (body) or `status` + `text`
        data,      // one SSE data payload (a Chat Completions chunk)
        done,      // the terminal marker ([DONE] / PULSE_END)
        failed,    // transport failure, before acceptance or mid-stream
        progress,  // prefill progress, no output: `progress` says how far (llama-server's return_progress)
    };
    Kind kind = Kind::timeout;
    int http_status = 0;
    pulse_status_t status = PULSE_OK;
    std::string text;
    bool stale = false;     // failed: a pooled connection had been closed by the backend; nothing was processed
    int retry_after_s = 0;  // rejected: the backend's Retry-After (seconds), 0 = none
    struct Progress {
        int64_t total = 0, cached = 0, processed = 0, time_ms = 0;  // prompt tokens; processed counts the cached ones too
    } progress;
};

// A backend's answer, read by the stream loop (stream_loop.h) without blocking: accepted or
// rejected, then the body's events. For an HTTP request, fd() is the connection and destroying
// the body closes it unless recycle() gave it back to the pool; for a backend plugin, fd() is an
// eventfd its stream's thread signals, and destroying the body cancels and closes the stream.
class DetachedBody {
public:
    virtual ~DetachedBody() = default;
    virtual int fd() const = 0;
    // Reads what has arrived, never blocking, and appends the events it completes (accepted,
    // rejected, data, done, failed) to `out`. After `done` it only looks for the body's end.
    virtual void read(std::vector<UpEvent>& out) = 0;
    // When the backend's silence is next looked at: upstream.head_timeout_s for the head, then
    // upstream.idle_timeout_s between chunks, or sooner to ask whether it is frozen
    // (liveness.h). silence(now) then gives the failure to report, or nothing yet.
    virtual std::chrono::steady_clock::time_point idle_deadline() const = 0;
    virtual std::optional<UpEvent> silence(std::chrono::steady_clock::time_point now) = 0;
    // The terminal marker and the end of the HTTP body were both read: the connection can
    // serve another request.
    virtual bool reusable() const = 0;
    // The terminal marker was read.
    virtual bool ended() const = 0;
    // The connection can no longer give anything (EOF, error, or a body that ended).
    virtual bool exhausted() const = 0;
    virtual void recycle() = 0;
};


// A profile's preparatory request (SDK 1.3 prepare): exchange_blocking bounded by the connect
// timeout and 30 s (or upstream.head_timeout_s).
int post_prepared(const config::Endpoint& ep, const pulse_upstream_req& req, const config::Upstream& timeouts, std::string* answer);

// Sends `req` to the endpoint the blocking way (an idle pooled connection unless `fresh`;
// bounded by the connect timeout) and returns the connection for the stream loop to read the
// response from. On failure: nullptr and a `failed` (before acceptance) event in `error`.
// With `liveness`, a silent backend is also asked whether it is frozen (liveness.h).
// `window_end`: the request's retry window ends then (upstream.retry_window_s). An attempt that
// has had no output by then is cut at that moment, unless the endpoint answered a liveness
// probe while the attempt waited (a long prefill on a live server is never cut by the window).
std::unique_ptr<DetachedBody> send_http(const config::Endpoint& ep, const pulse_upstream_req& req, const config::Upstream& timeouts,
                                        bool fresh, UpEvent& error, Liveness* liveness = nullptr,
                                        std::chrono::steady_clock::time_point window_end = std::chrono::steady_clock::time_point::max());

// GET {base}/models on a connection of its own, bounded by `timeout_s` in all.
struct ProbeAnswer {
    bool answered = false;  // an HTTP response came (any status)
    int status = 0;
    std::string path, body, error;  // error: why nothing came
};
ProbeAnswer get_models(const config::Endpoint& ep, double timeout_s);

// Active health probe of an HTTP endpoint: GET {base}/models within `timeout_s`, its answer
// read by the model's profile (`dialect`). Returns "" when ready, "loading: ..." while the
// server starts, else why it is down.
std::string probe_http(const config::Endpoint& ep, double timeout_s, const BackendDialect& dialect, std::string* body = nullptr);

// The model ids an OpenAI-style GET /models answer lists ({"data":[{"id":...}]}); empty when
// the body is not such a list.
std::vector<std::string> listed_models(std::string_view body);
// Whether such an answer comes from a server that serves only the names it lists (vLLM: every
// entry "owned_by": "vllm"; it answers any other name 404). llama-server answers any name.
bool serves_only_listed(std::string_view body);

// Sends `req` (its method, path and body) on a fresh connection the blocking way and returns
// the HTTP status (0 when the endpoint could not be reached or the exchange broke), with at most
// `max_answer` bytes of the answer's body (or the error) in `answer`.
int exchange_blocking(const config::Endpoint& ep, const pulse_upstream_req& req, http::Timeouts t, size_t max_answer, std::string* answer);

// A backend plugin instance (one per endpoint that names it).
// A backend instance that could not be created: `status` says whose fault (INVALID_ARGUMENT:
// its options; anything else: it cannot start now, e.g. its model file is missing).
struct BackendStartError : std::runtime_error {
    BackendStartError(pulse_status_t s, const std::string& what) : std::runtime_error(what), status(s) {}
    pulse_status_t status;
};

class BackendInstance {
public:
    BackendInstance(plugin::ComponentLease lease, const std::string& options_json);
    ~BackendInstance();
    // The host waits for a first chunk up to `timeouts.head_timeout_s` and between chunks up to
    // `timeouts.idle_timeout_s`, as for an HTTP backend; the plugin sees that moment as its
    // calls' deadline (host->call_deadline_ms). Past it the stream fails (before any output:
    // the next endpoint may serve the request).
    // The stream loop reads the result like an HTTP response (the same events). On refusal:
    // nullptr and a `rejected` event in `error`.
    std::unique_ptr<DetachedBody> open(std::string_view request_json, const std::string& request_id, const config::Upstream& timeouts,
                                       UpEvent& error);
    const std::string& name() const { return lease_->registration.name; }
    // Whether the backend enforces the reasoning cap in request field `field` (ABI 1.2
    // budget_fields; a 1.0/1.1 backend declares none).
    bool enforces(std::string_view field) const;
    // The backend's own health hook; "" when healthy (or when it has no hook). `detail` gets
    // the JSON object the hook wrote, when it wrote one.
    std::string health(std::string* detail = nullptr);

private:
    plugin::ComponentLease lease_;
    void* backend_ = nullptr;
};

}  // namespace pulse::gateway
