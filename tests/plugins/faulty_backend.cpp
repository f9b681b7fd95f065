// A backend that fails on purpose, for the gateway's status-code drills: every stream fails at
// `stream_start` or at its first `stream_next` with the configured status, or (fail = "silent")
// never produces a chunk, logging the call deadlines the host gives it.
//   options = { fail = "start" | "next" | "silent" | "null" | "blocking" | "sleepy" | "empty" | "badchunk", status = NAME }
// ("badchunk": writes an unfinished chunk with the host's writer and returns what end() said;
// "after": one content delta, then the status on the next call: a failure after output)
// ("null": stream_start returns PULSE_OK without a stream, a plugin bug the host must survive;
// the engines that block in stream_next, as one doing real work does: "blocking" emits 20
// deltas 100 ms apart within one call, "sleepy" sleeps 3 s before its first chunk, both
// whatever timeout_ms says; "empty" ends its stream without a chunk; "endless" emits a 64 KiB
// content delta at every call, as fast as it is asked, until cancelled, and logs at
// stream_close how many it emitted)
// It also provides a translation profile, "test-faulty-profile", that passes the Responses
// input through as one user message and fails in the named call:
//   profile_options = { fail = "build" | "open" | "feed" | "finish", status = NAME }
// NAME is a status in lower case ("invalid_argument", ..., "context_length") or "bogus" (-42,
// a code no 1.0 table has).
// Lifecycle check: the plugin's state is poisoned by deinit, and every destroy and close checks
// it: one that runs after deinit (a use after free in a real plugin) aborts the process.
#include <pulse/plugin.hpp>

#include <time.h>

#include <cstdio>
#include <cstdlib>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace {

const pulse_host_api_t* g_host = nullptr;
pulse_host_ctx_t* g_ctx = nullptr;
std::atomic<int> g_streams{0};
std::atomic<bool> g_alive{false};  // between init and deinit

// What a plugin that frees its state in deinit would do to it from here: use after free.
void check_alive(const char* what) {
    if (g_alive) return;
    std::fprintf(stderr, "test-faulty: %s after deinit (a use after free in a real plugin)\n", what);
    std::abort();
}

struct Backend {
    bool at_start = false, silent = false, null_stream = false, told = false;
    int64_t emitted = 0;
    std::string mode;
    pulse_status_t status = PULSE_E_INTERNAL;
    std::atomic<bool> cancelled{false};
    Backend() = default;
    Backend(const Backend& o) : at_start(o.at_start), silent(o.silent), null_stream(o.null_stream), mode(o.mode), status(o.status) {}
};

// "<what> deadline in N ms" (N = -1: no deadline), for the tests to read from the log.
void log_deadline(pulse_call_t* call, const char* what) {
    uint64_t d = g_host->call_deadline_ms(call);
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
    long long left = d ? static_cast<long long>(d) - now : -1;
    pulse::Log(g_host, g_ctx)(PULSE_LOG_INFO, std::string("test-faulty: ") + what + " deadline in " + std::to_string(left) + " ms", call);
}

pulse_status_t parse_status(std::string_view s) {
    if (s == "invalid_argument") return PULSE_E_INVALID_ARGUMENT;
    if (s == "unsupported") return PULSE_E_UNSUPPORTED;
    if (s == "unavailable") return PULSE_E_UNAVAILABLE;
    if (s == "resource_exhausted") return PULSE_E_RESOURCE_EXHAUSTED;
    if (s == "cancelled") return PULSE_E_CANCELLED;
    if (s == "deadline") return PULSE_E_DEADLINE;
    if (s == "internal") return PULSE_E_INTERNAL;
    if (s == "abi") return PULSE_E_ABI;
    if (s == "context_length") return PULSE_E_CONTEXT_LENGTH;
    if (s == "bogus") return -42;
    throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "test-faulty: unknown status '" + std::string(s) + "'");
}

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json cfg(g_host->json, config);
        auto b = std::make_unique<Backend>();
        b->at_start = cfg["fail"].string_or("next") == "start";
        b->silent = cfg["fail"].string_or("next") == "silent";
        b->null_stream = cfg["fail"].string_or("next") == "null";
        b->mode = std::string(cfg["fail"].string_or("next"));
        b->status = parse_status(cfg["status"].string_or("internal"));
        *out = b.release();
        return PULSE_OK;
    });
}

void destroy(void* b) {
    check_alive("backend destroy");
    delete static_cast<Backend*>(b);
}

pulse_status_t stream_start(void* backend, pulse_call_t* call, const pulse_json_t*, void** out) {
    const auto& b = *static_cast<Backend*>(backend);
    int n = ++g_streams;
    if (b.at_start) return g_host->set_error(call, b.status, pulse::str("test-faulty: refused stream " + std::to_string(n) + " at start"));
    if (b.null_stream) return PULSE_OK;  // *out left null: the bug under test
    if (b.silent) log_deadline(call, "stream_start");
    *out = new Backend(b);
    return PULSE_OK;
}

pulse_status_t stream_next(void* stream, pulse_call_t* call, uint32_t timeout_ms, pulse_chunk_sink_t* sink) {
    auto& s = *static_cast<Backend*>(stream);
    auto chunk = [&](const std::string& delta, const char* finish = "null") {
        return g_host->chunk->data(sink, pulse::str(R"({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":)" + delta +
                                                    R"(,"finish_reason":)" + finish + "}]}"));
    };
    if (s.mode == "empty") return PULSE_END;
    if (s.mode == "endless") {
        if (s.cancelled) return g_host->set_error(call, PULSE_E_CANCELLED, pulse::str("test-faulty: cancelled"));
        ++s.emitted;
        return chunk(R"({"content":")" + std::string(64 << 10, 'x') + R"("})");
    }
    if (s.mode == "after" && !s.told) {
        s.told = true;
        return chunk(R"({"content":"partial answer"})");
    }
    if (s.mode == "badchunk") {
        pulse_json_writer_t* w = g_host->chunk->begin(sink);
        g_host->json->begin_object(w);  // never closed
        return g_host->chunk->end(sink);
    }
    if (s.mode == "blocking" || s.mode == "sleepy") {
        if (s.told) return PULSE_END;
        s.told = true;
        if (s.mode == "sleepy") std::this_thread::sleep_for(std::chrono::seconds(3));
        for (int i = 0; i < (s.mode == "blocking" ? 20 : 1); ++i) {
            if (s.mode == "blocking") std::this_thread::sleep_for(std::chrono::milliseconds(100));
            chunk(R"({"content":"w)" + std::to_string(i) + R"( "})");
        }
        chunk("{}", "\"stop\"");
        return PULSE_OK;
    }
    if (s.silent) {
        if (!s.told) log_deadline(call, "stream_next");
        s.told = true;
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (!s.cancelled && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return s.cancelled ? g_host->set_error(call, PULSE_E_CANCELLED, pulse::str("test-faulty: cancelled")) : PULSE_TIMEOUT;
    }
    return g_host->set_error(call, s.status, pulse::str("test-faulty: failed stream " + std::to_string(g_streams.load()) + " at its first chunk"));
}

void stream_cancel(void* stream) { static_cast<Backend*>(stream)->cancelled = true; }
void stream_close(void* stream) {
    check_alive("stream_close");
    if (const auto& s = *static_cast<Backend*>(stream); s.mode == "endless")
        pulse::Log(g_host, g_ctx)(PULSE_LOG_INFO, "test-faulty: the endless stream emitted " + std::to_string(s.emitted) + " chunks");
    delete static_cast<Backend*>(stream);
}

// ---- the profile ----
struct Profile {
    std::string at = "build";
    pulse_status_t status = PULSE_E_INTERNAL;
    pulse_status_t fail(pulse_call_t* call, const char* where) const {
        if (at != where) return PULSE_OK;
        return g_host->set_error(call, status, pulse::str(std::string("test-faulty-profile: ") + where + " failed"));
    }
};

pulse_status_t p_create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json cfg(g_host->json, config);
        auto p = std::make_unique<Profile>();
        p->at = std::string(cfg["fail"].string_or("build"));
        p->status = parse_status(cfg["status"].string_or("internal"));
        *out = p.release();
        return PULSE_OK;
    });
}
void p_destroy(void* p) {
    check_alive("profile destroy");
    delete static_cast<Profile*>(p);
}

pulse_status_t p_build(void* inst, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                       pulse_upstream_req_t* out) {
    const auto& p = *static_cast<Profile*>(inst);
    if (pulse_status_t rc = p.fail(call, "build"); rc != PULSE_OK) return rc;
    return pulse::guard(g_host, call, [&] {
        pulse::Json req(g_host->json, request), m(g_host->json, model);
        pulse::Writer w(g_host->json, g_host->request->body(out));
        w.begin_object().kv("model", m["upstream_model"].string_or("m")).key("stream").boolean(true);
        w.key("messages").begin_array().begin_object().kv("role", "user").kv("content", req["input"].string_or("")).end_object().end_array();
        w.end_object();
        return w.ok() ? PULSE_OK : PULSE_E_INTERNAL;
    });
}
pulse_status_t p_open(void* inst, pulse_call_t* call, const pulse_json_t*, void** out) {
    if (pulse_status_t rc = static_cast<Profile*>(inst)->fail(call, "open"); rc != PULSE_OK) return rc;
    *out = inst;
    return PULSE_OK;
}
pulse_status_t p_feed(void* stream, pulse_call_t* call, pulse_str_t, pulse_delta_sink_t*) {
    return static_cast<Profile*>(stream)->fail(call, "feed");  // no output: the chunks are dropped
}
pulse_status_t p_finish(void* stream, pulse_call_t* call, pulse_stream_end_t, pulse_delta_sink_t* sink) {
    if (pulse_status_t rc = static_cast<Profile*>(stream)->fail(call, "finish"); rc != PULSE_OK) return rc;
    return g_host->delta->finish(sink, PULSE_FINISH_STOP);
}
void p_close(void*) { check_alive("profile stream close"); }

const pulse_translation_vt_t kProfile = {
    sizeof(pulse_translation_vt_t), "test-faulty-profile", p_create, p_destroy, p_build, p_open, p_feed, p_finish, p_close, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
};

const pulse_backend_vt_t kBackend = {
    sizeof(pulse_backend_vt_t), "test-faulty", create, destroy, stream_start, stream_next, stream_cancel, stream_close, nullptr, nullptr,
};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    g_ctx = ctx;
    *state = nullptr;
    g_alive = true;
    return pulse::guard(host, call, [&] {
        if (pulse_status_t rc = host->register_backend(ctx, &kBackend, sizeof kBackend, nullptr); rc != PULSE_OK) return rc;
        return host->register_translation(ctx, &kProfile, sizeof kProfile, nullptr);
    });
}

void deinit(void*) { g_alive = false; }

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_BACKEND | PULSE_KIND_TRANSLATION, "test.faulty-backend", "1.0.0"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
