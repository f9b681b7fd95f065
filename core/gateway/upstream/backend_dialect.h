// What warmup and health need to know about one particular server — how to make it read a
// conversation's prompt again cheaply, how to save and restore its prompt cache, what its probe
// answers mean — asked of the model's translation profile (SDK 1.4 warm_request, cache_request,
// cache_answer, probe_answer), so that the host itself speaks no backend dialect. A profile
// built against SDK 1.0-1.3 has none of these hooks: its endpoints get no replays and no cache
// persistence, and their probe is ready exactly when it answers HTTP 200.
#pragma once

#include <pulse/plugin.h>

#include <memory>
#include <string>
#include <string_view>

namespace pulse::gateway {

struct ModelRuntime;
struct Snapshot;

class BackendDialect {
public:
    BackendDialect() = default;  // no profile: the generic behaviour
    // `keep` holds the snapshot that owns `rt` (and so the profile instance) for as long as
    // this object lives; null when the caller holds it.
    BackendDialect(const ModelRuntime& rt, std::shared_ptr<const Snapshot> keep);

    // The cheap replay of `sent` (a served request: {"path", "root_path", "body"} as JSON text),
    // or nullptr when this one is not replayed (or the profile has no warm_request).
    std::unique_ptr<pulse_upstream_req> warm_request(std::string_view sent) const;
    bool warms() const { return vt_ && vt_->warm_request; }

    // Reads a replay's answer through the profile's stream: the prompt usage it reports.
    class UsageReader {
    public:
        ~UsageReader();
        void feed(std::string_view chunk);
        void finish(bool clean);
        int64_t input() const;   // prompt tokens, 0 when not reported
        int64_t cached() const;  // of them found in the server's cache
    private:
        friend class BackendDialect;
        struct Sink;
        const pulse_translation_vt_t* vt_ = nullptr;
        void* stream_ = nullptr;
        std::unique_ptr<Sink> sink_;
    };
    std::unique_ptr<UsageReader> read_usage() const;

    // The server's prompt-cache persistence. persists() is false when the profile has no such
    // hooks. cache_request: the request for `op`, or nullptr with the status (UNSUPPORTED: the
    // server has no such thing) and why.
    bool persists() const { return vt_ && vt_->cache_request && vt_->cache_answer; }
    std::unique_ptr<pulse_upstream_req> cache_request(pulse_cache_op_t op, int slot, const std::string& file, pulse_status_t* status,
                                                      std::string* why) const;
    // The answer to a cache request: OK (COUNT: *count), UNSUPPORTED (this server cannot: stop
    // asking) or another error; `why` gets the profile's message.
    pulse_status_t cache_answer(pulse_cache_op_t op, int http_status, std::string_view body, int* count, std::string* why) const;

    // What a probe's answer means: "" ready, "loading: ..." starting (not failed), else why the
    // endpoint is down. `target` is the path the probe asked, for the message.
    std::string probe(int http_status, std::string_view body, const std::string& target) const;

    const std::string& profile() const;

private:
    std::string message(const pulse_call& call, pulse_status_t rc) const;

    std::shared_ptr<const Snapshot> keep_;
    const ModelRuntime* rt_ = nullptr;
    const pulse_translation_vt_t* vt_ = nullptr;
};

}  // namespace pulse::gateway
