// The streaming phase of every upstream, driven by a few epoll threads instead of one thread
// per stream (docs/ARCHITECTURE.md, "Threading").
//
// A request thread does everything up to the attempt (parsing, translation, failover, sending
// an HTTP request or starting a backend plugin's stream) the blocking way, then hands the
// backend's answer (a DetachedBody: an HTTP connection, or a plugin stream's eventfd) and the
// client to a loop and sleeps until the loop is done with them. The loop reads every backend
// that has data, runs the attempt's event handler for it, and writes what it produced to the
// clients; tokens that arrive together (one decode step of a batched backend) cost one
// wake-up, not one per stream. Keepalives, the backends' head and idle deadlines, the client's
// send timeout, a client that leaves and the drain cut are handled here, the same for both kinds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gateway/upstream/upstream.h"
#include "server/http_server.h"

namespace pulse::gateway {

// One relayed stream, as the loop sees it. Every call comes on the loop thread while the
// thread that submitted the job waits in StreamLoop::run(), so the job's state needs no lock.
class RelayJob {
public:
    virtual ~RelayJob() = default;
    // The client's exchange: the loop writes through its Outbox (the one client writer) and
    // marks it lost when the client goes away or stops reading.
    virtual server::Exchange& client() = 0;
    // One upstream event (data, done, failed). Returns true when the job is over.
    virtual bool on_upstream(UpEvent e) = 0;
    // Periodic duties (keepalive events) when next_timer() has passed. Returns true when over.
    virtual bool on_timer() = 0;
    virtual std::chrono::steady_clock::time_point next_timer() const = 0;
    // The client went away or stopped reading; the job ends.
    virtual void on_client_lost() = 0;
    // The gateway is stopping (drain deadline): the job ends its response now; what it
    // produced is sent as with any last event.
    virtual void on_cut() = 0;
    // Appends the bytes produced for the client since the last call, ready for the wire.
    virtual void take_output(std::string& wire) = 0;
};

class StreamLoop {
public:
    explicit StreamLoop(int threads);
    ~StreamLoop();  // jobs still running end as if their client had gone
    StreamLoop(const StreamLoop&) = delete;
    StreamLoop& operator=(const StreamLoop&) = delete;

    // Relays `body` to the job's client on a loop thread; returns when the job is over. What
    // the job produced with its last event is queued in the client's Outbox behind what the
    // client had not taken yet; the response's end follows it there.
    void run(RelayJob& job, std::unique_ptr<DetachedBody> body);
    // Ends every job now through on_cut() (drain deadline).
    void cut_all();

    // Client bytes one stream may have queued before the loop stops reading its backend (TCP
    // then holds the backend back): a client that reads slowly costs this much memory, no more.
    static constexpr size_t kMaxClientBuffer = 1 << 20;

private:
    class Thread;
    std::vector<std::unique_ptr<Thread>> threads_;
    std::atomic<size_t> next_{0};
};

}  // namespace pulse::gateway
