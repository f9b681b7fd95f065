// An in-process backend plugin's stream (PluginBody): its stream_next calls on a thread of its
// own, the chunks handed to the stream loop; and the backend instance that opens such streams.
#include "gateway/upstream/upstream.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/log.h"
#include "common/wakeup.h"
#include "gateway/upstream/upstream_failure.h"

namespace pulse::gateway {
namespace {

using namespace std::chrono;

// A steady_clock time point as host->call_deadline_ms reports it: CLOCK_MONOTONIC milliseconds
// (steady_clock is CLOCK_MONOTONIC on Linux).
uint64_t monotonic_ms(steady_clock::time_point t) {
    return static_cast<uint64_t>(duration_cast<milliseconds>(t.time_since_epoch()).count());
}

// What a backend's stream_next emits, queued for the stream loop, which an eventfd wakes.
struct ChunkCollector : pulse_chunk_sink {
    std::mutex m;
    std::deque<std::string> chunks;  // under m
    size_t bytes = 0;                // under m: of the chunks queued
    std::condition_variable room;    // the queue was read (or the stream cancelled)
    Wakeup loop;                     // the stream loop waits on it
    pulse_status_t data(std::string_view payload) override {
        {
            std::lock_guard lock(m);
            chunks.emplace_back(payload);
            bytes += payload.size();
        }
        loop.signal();
        return PULSE_OK;
    }
};

// An in-process backend's stream, read by the stream loop like an HTTP response: its
// stream_next calls run on a thread of their own (a call that does real work, or waits past its
// timeout_ms, holds no request thread and no loop), each emitted chunk is queued and the loop
// woken through an eventfd; the loop turns the queue into the same events an HTTP body gives,
// and judges the backend's silence by the same head and idle timeouts.
class PluginBody : public DetachedBody {
public:
    PluginBody(plugin::ComponentLease lease, void* stream, std::string request_id, const config::Upstream& t,
               steady_clock::time_point head_deadline)
        : lease_(std::move(lease)), stream_(stream), request_id_(std::move(request_id)),
          idle_(duration_cast<steady_clock::duration>(duration<double>(t.idle_timeout_s))), idle_timeout_s_(t.idle_timeout_s),
          head_timeout_s_(t.head_timeout_s), deadline_(head_deadline), call_deadline_ms_(monotonic_ms(head_deadline)) {
        worker_ = std::thread([this] { run(); });
    }
    ~PluginBody() override {
        bool over;
        {
            std::lock_guard lock(sink_.m);
            over = over_;
        }
        if (!over) cancel();  // a stream abandoned mid-way (client gone, failover, drain)
        worker_.join();  // [stream-serial]: stream_close after the last stream_next returned
        vt().stream_close(stream_);
    }

    int fd() const override { return sink_.loop.fd(); }

    void read(std::vector<UpEvent>& out) override {
        sink_.loop.clear();
        if (reported_end_) return;
        if (!announced_) {
            announced_ = true;
            out.push_back(UpEvent{UpEvent::Kind::accepted, 200, PULSE_OK, {}, false, 0, {}});
        }
        std::lock_guard lock(sink_.m);
        if (!sink_.chunks.empty()) {
            got_output_ = true;
            deadline_ = steady_clock::now() + idle_;
            call_deadline_ms_ = monotonic_ms(deadline_);
        }
        for (auto& c : sink_.chunks) out.push_back(UpEvent{UpEvent::Kind::data, 0, PULSE_OK, std::move(c), false, 0, {}});
        sink_.chunks.clear();
        sink_.bytes = 0;
        sink_.room.notify_one();
        if (!over_) return;
        reported_end_ = true;
        if (failure_) {
            out.push_back(std::move(*failure_));
        } else if (!got_output_) {
            // The end before any chunk: nothing was answered, not even a finish reason (an HTTP
            // backend that closes its stream so is retried too).
            out.push_back(UpEvent{UpEvent::Kind::failed, 0, PULSE_E_UNAVAILABLE,
                                  "backend '" + lease_->registration.name + "' ended its stream without a chunk", false, 0, {}});
        } else {
            out.push_back(UpEvent{UpEvent::Kind::done, 0, PULSE_OK, {}, false, 0, {}});
        }
    }

    steady_clock::time_point idle_deadline() const override { return reported_end_ ? steady_clock::time_point::max() : deadline_; }

    std::optional<UpEvent> silence(steady_clock::time_point now) override {
        if (reported_end_ || now < deadline_) return std::nullopt;
        cancel();  // the plugin's own work stops too; stream_close follows
        reported_end_ = true;
        return upstream_failure(got_output_, got_output_ ? "no chunk from backend '" + lease_->registration.name + "' for " +
                                                               seconds_text(idle_timeout_s_) + " s (upstream.idle_timeout_s)"
                                                         : "no output from backend '" + lease_->registration.name + "' within " +
                                                               seconds_text(head_timeout_s_) + " s (upstream.head_timeout_s)");
    }

    // Nothing to keep: a stream serves one request, and ends with its terminal event.
    bool reusable() const override { return false; }
    bool ended() const override { return reported_end_; }
    bool exhausted() const override { return reported_end_; }
    void recycle() override {}

private:
    const pulse_backend_vt_t& vt() const { return lease_->registration.backend; }

    void cancel() {
        {
            std::lock_guard lock(sink_.m);  // a worker waiting for room sees it
            cancelled_ = true;
        }
        sink_.room.notify_one();
        vt().stream_cancel(stream_);
    }

    // The worker: stream_next until the stream ends, fails or is cancelled.
    void run() {
        for (;;) {
            {
                // Backpressure: while the loop holds a stream back (its client reads slowly) the
                // queue is not read, and the engine is not asked for more than a bounded amount.
                std::unique_lock lock(sink_.m);
                sink_.room.wait(lock, [&] { return cancelled_.load() || sink_.bytes < kMaxQueued; });
            }
            pulse_call call;
            call.request_id = request_id_;
            call.cancelled = &cancelled_;
            call.deadline_ms = call_deadline_ms_.load();
            sink_.writer.call = &call;
            pulse_status_t rc = vt().stream_next(stream_, &call, kCallMs, &sink_);
            sink_.writer.call = nullptr;
            // A chunk the host's writer refused is the plugin's bug, whatever status it passed
            // on (the writer's INVALID_ARGUMENT would blame the client's request with a 400).
            if (rc < 0 && rc != PULSE_E_CANCELLED && sink_.writer.failed) {
                call.message = "backend '" + lease_->registration.name + "' (plugin " + lease_->plugin_id() +
                               ") wrote a chunk the host could not take (plugin bug): " + sink_.writer.error;
                call.has_message = true;
                rc = PULSE_E_INTERNAL;
            }
            if (rc == PULSE_OK || rc == PULSE_TIMEOUT) {
                if (!cancelled_) continue;
                rc = PULSE_E_CANCELLED;
            }
            {
                std::lock_guard lock(sink_.m);
                if (rc != PULSE_END)
                    failure_ = UpEvent{UpEvent::Kind::failed, 0, rc, host::call_error(call, rc, lease_->plugin_id()), false, 0, {}};
                over_ = true;
            }
            sink_.loop.signal();
            return;
        }
    }

    // How long one stream_next may wait for a chunk before it returns PULSE_TIMEOUT; it is called
    // again at once. Cancellation and deadlines reach the call through call_cancelled and
    // call_deadline_ms, so this only bounds how often an idle engine is polled.
    static constexpr uint32_t kCallMs = 200;
    // Chunk bytes queued for the loop past which stream_next is not called again until it reads:
    // with the client's own queue (StreamLoop::kMaxClientBuffer) what a slow client costs.
    static constexpr size_t kMaxQueued = 1 << 20;

    plugin::ComponentLease lease_;
    void* stream_;
    std::string request_id_;
    ChunkCollector sink_;
    std::atomic<bool> cancelled_{false};
    steady_clock::duration idle_;
    double idle_timeout_s_, head_timeout_s_;
    steady_clock::time_point deadline_;       // no chunk by then: the stream has failed (loop thread)
    std::atomic<uint64_t> call_deadline_ms_;  // the same, for the calls
    std::thread worker_;
    bool over_ = false;                   // under sink_.m: the worker returned
    std::optional<UpEvent> failure_;      // under sink_.m: how, if it failed
    bool announced_ = false, got_output_ = false, reported_end_ = false;  // loop thread
};

}  // namespace

std::string BackendInstance::health(std::string* detail) {
    const auto& vt = lease_->registration.backend;
    if (!vt.health) return {};
    pulse_call call;
    pulse_json_writer w;
    w.call = &call;
    pulse_status_t rc = vt.health(backend_, &call, &w);
    if (detail) *detail = w.complete() && !w.text().empty() && w.text().front() == '{' ? std::string(w.text()) : std::string();
    return rc == PULSE_OK ? std::string() : host::call_error(call, rc, lease_->plugin_id());
}

BackendInstance::BackendInstance(plugin::ComponentLease lease, const std::string& options_json)
    : lease_(std::move(lease)) {
    rapidjson::Document opts;
    opts.Parse(options_json.c_str());
    pulse_call call;
    const auto& vt = lease_->registration.backend;
    pulse_status_t rc = vt.create(lease_->registration.user, &call, opts.IsNull() ? nullptr : host::view(&opts), &backend_);
    if (rc != PULSE_OK)
        throw BackendStartError(rc, "backend '" + name() + "': create failed: " + host::call_error(call, rc, lease_->plugin_id()));
}

bool BackendInstance::enforces(std::string_view field) const {
    const pulse_backend_vt_t& vt = lease_->registration.backend;
    if (!PULSE_HAS_FIELD(&vt, pulse_backend_vt_t, budget_fields) || !vt.budget_fields) return false;
    for (const char* const* f = vt.budget_fields; *f; ++f)
        if (field == *f) return true;
    return false;
}

BackendInstance::~BackendInstance() {
    if (backend_ && lease_->registration.backend.destroy) lease_->registration.backend.destroy(backend_);
}

std::unique_ptr<DetachedBody> BackendInstance::open(std::string_view request_json, const std::string& request_id, const config::Upstream& timeouts,
                                                     UpEvent& error) {
    rapidjson::Document doc;
    doc.Parse(request_json.data(), request_json.size());
    const auto head_deadline = steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(timeouts.head_timeout_s));
    pulse_call call;
    call.request_id = request_id;
    call.deadline_ms = monotonic_ms(head_deadline);
    void* stream = nullptr;
    const auto& vt = lease_->registration.backend;
    pulse_status_t rc = vt.stream_start(backend_, &call, host::view(&doc), &stream);
    if (rc == PULSE_OK && !stream) {
        // Nothing to read from and nothing to close: refused here, not followed into a crash, and
        // counted as this endpoint's failure, so the request moves on to the next one.
        rc = PULSE_E_UNAVAILABLE;
        call.message = "backend '" + name() + "' (plugin " + lease_->plugin_id() + ") returned PULSE_OK from stream_start without a stream (plugin bug)";
        call.has_message = true;
        log::error("plugins", call.message);
    }
    if (rc != PULSE_OK) {
        error = UpEvent{};
        error.kind = UpEvent::Kind::rejected;
        error.status = rc;
        error.text = host::call_error(call, rc, lease_->plugin_id());
        return nullptr;
    }
    return std::make_unique<PluginBody>(lease_, stream, request_id, timeouts, head_deadline);
}

}  // namespace pulse::gateway
