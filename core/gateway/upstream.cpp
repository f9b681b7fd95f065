#include "gateway/upstream.h"

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/NetException.h>
#include <Poco/URI.h>

#include <condition_variable>
#include <deque>
#include <istream>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "common/log.h"
#include "gateway/sse.h"

namespace pulse::gateway {
namespace {

using namespace std::chrono;

// A bounded queue between the reader thread and the request thread.
class EventQueue {
public:
    void push(UpEvent e) {
        std::unique_lock lock(m_);
        room_.wait(lock, [&] { return (q_.size() < kMaxEvents && bytes_ < kMaxBytes) || closed_; });
        if (closed_) return;
        bytes_ += e.text.size();
        q_.push_back(std::move(e));
        ready_.notify_one();
    }
    UpEvent pop(milliseconds wait) {
        std::unique_lock lock(m_);
        if (!ready_.wait_for(lock, wait, [&] { return !q_.empty(); })) return UpEvent{};
        UpEvent e = std::move(q_.front());
        q_.pop_front();
        bytes_ -= e.text.size();
        room_.notify_one();
        return e;
    }
    void close() {
        std::lock_guard lock(m_);
        closed_ = true;
        room_.notify_all();
    }

private:
    // Backpressure: a slow client slows the reader, and through TCP the backend.
    static constexpr size_t kMaxEvents = 4096;
    static constexpr size_t kMaxBytes = 1 << 20;
    size_t bytes_ = 0;
    std::mutex m_;
    std::condition_variable ready_, room_;
    std::deque<UpEvent> q_;
    bool closed_ = false;
};

class HttpStream : public UpstreamStream {
public:
    HttpStream(const config::Endpoint& ep, const pulse_upstream_req& req, const config::Upstream& t)
        : uri_(ep.url), body_(req.body.text()), headers_(req.headers), timeouts_(t) {
        std::string base = uri_.getPath();
        while (!base.empty() && base.back() == '/') base.pop_back();
        path_ = base + req.path;
        thread_ = std::thread([this] { run(); });
    }
    ~HttpStream() override {
        cancel();
        queue_.close();
        thread_.join();
    }

    UpEvent next(milliseconds wait) override { return queue_.pop(wait); }

    void cancel() override {
        cancelled_ = true;
        std::lock_guard lock(session_mutex_);
        if (session_) {
            try {
                session_->abort();
            } catch (...) {
            }
        }
    }

private:
    void run() {
        bool accepted = false;
        try {
            {
                std::lock_guard lock(session_mutex_);
                if (cancelled_) return;
                session_ = std::make_unique<Poco::Net::HTTPClientSession>(uri_.getHost(), uri_.getPort());
                auto secs = [](double s) { return Poco::Timespan(static_cast<Poco::Timespan::TimeDiff>(s * 1e6)); };
                session_->setTimeout(secs(timeouts_.connect_timeout_s), secs(30), secs(timeouts_.idle_timeout_s));
                session_->setKeepAlive(false);
            }
            Poco::Net::HTTPRequest request(Poco::Net::HTTPRequest::HTTP_POST, path_, Poco::Net::HTTPMessage::HTTP_1_1);
            request.setContentType("application/json");
            request.set("Accept", "text/event-stream");
            request.setContentLength(static_cast<std::streamsize>(body_.size()));
            for (const auto& [k, v] : headers_) request.set(k, v);
            std::ostream& os = session_->sendRequest(request);
            os.write(body_.data(), static_cast<std::streamsize>(body_.size()));
            os.flush();
            Poco::Net::HTTPResponse response;
            std::istream& is = session_->receiveResponse(response);
            int status = static_cast<int>(response.getStatus());
            if (status != 200) {
                std::string text;
                char buf[4096];
                while (text.size() < 64 * 1024 && is.read(buf, sizeof buf).gcount() > 0) text.append(buf, static_cast<size_t>(is.gcount()));
                UpEvent e;
                e.kind = UpEvent::Kind::rejected;
                e.http_status = status;
                e.text = std::move(text);
                queue_.push(std::move(e));
                return;
            }
            accepted = true;
            queue_.push(UpEvent{UpEvent::Kind::accepted, 200, PULSE_OK, {}, false});
            SseParser parser;
            bool done = false;
            std::string line;
            while (!done && std::getline(is, line)) {
                line += '\n';
                parser.feed(line, [&](std::string_view, std::string_view data) {
                    if (done) return;
                    if (data == "[DONE]") {
                        done = true;
                        queue_.push(UpEvent{UpEvent::Kind::done, 0, PULSE_OK, {}, false});
                    } else {
                        queue_.push(UpEvent{UpEvent::Kind::data, 0, PULSE_OK, std::string(data), false});
                    }
                });
                if (parser.overflowed()) throw std::runtime_error("upstream sent an SSE line over 16 MiB");
            }
            if (!done) {
                // POCO reports an aborted body read as a clean EOF: without the terminal marker the
                // stream is truncated, never complete.
                queue_.push(UpEvent{UpEvent::Kind::failed, 0, PULSE_E_UNAVAILABLE,
                                    "the backend stream ended without its terminal [DONE] marker", false});
            }
        } catch (const Poco::Exception& e) {
            fail(accepted, e.displayText());
        } catch (const std::exception& e) {
            fail(accepted, e.what());
        }
    }

    void fail(bool accepted, const std::string& what) {
        if (cancelled_) return;
        UpEvent e;
        e.kind = UpEvent::Kind::failed;
        e.status = PULSE_E_UNAVAILABLE;
        e.before_accept = !accepted;
        e.text = (accepted ? "the backend connection broke mid-stream: " : "cannot reach the backend: ") + what;
        queue_.push(std::move(e));
    }

    Poco::URI uri_;
    std::string path_, body_;
    std::vector<std::pair<std::string, std::string>> headers_;
    config::Upstream timeouts_;
    EventQueue queue_;
    std::mutex session_mutex_;
    std::unique_ptr<Poco::Net::HTTPClientSession> session_;
    std::atomic<bool> cancelled_{false};
    std::thread thread_;
};

// Collects the chunks one stream_next call emits.
struct ChunkCollector : pulse_chunk_sink {
    std::deque<std::string> chunks;
    pulse_status_t data(std::string_view payload) override {
        chunks.emplace_back(payload);
        return PULSE_OK;
    }
};

class PluginStream : public UpstreamStream {
public:
    PluginStream(plugin::ComponentLease lease, void* stream, std::string request_id)
        : lease_(std::move(lease)), stream_(stream), request_id_(std::move(request_id)) {}
    ~PluginStream() override { vt().stream_close(stream_); }

    UpEvent next(milliseconds wait) override {
        if (!announced_) {
            announced_ = true;
            return UpEvent{UpEvent::Kind::accepted, 200, PULSE_OK, {}, false};
        }
        if (!sink_.chunks.empty()) return pop();
        if (finished_) return UpEvent{UpEvent::Kind::done, 0, PULSE_OK, {}, false};
        pulse_call call;
        call.request_id = request_id_;
        call.cancelled = &cancelled_;
        pulse_status_t rc = vt().stream_next(stream_, &call, static_cast<uint32_t>(wait.count()), &sink_);
        if (!sink_.chunks.empty()) {
            if (rc == PULSE_END) finished_ = true;
            return pop();
        }
        if (rc == PULSE_END) return UpEvent{UpEvent::Kind::done, 0, PULSE_OK, {}, false};
        if (rc == PULSE_TIMEOUT || rc == PULSE_OK) return UpEvent{};
        return UpEvent{UpEvent::Kind::failed, 0, rc, host::call_error(call, rc, lease_->plugin_id()), false};
    }

    void cancel() override {
        cancelled_ = true;
        vt().stream_cancel(stream_);
    }

private:
    const pulse_backend_vt_t& vt() const { return lease_->registration.backend; }
    UpEvent pop() {
        UpEvent e{UpEvent::Kind::data, 0, PULSE_OK, std::move(sink_.chunks.front()), false};
        sink_.chunks.pop_front();
        return e;
    }

    plugin::ComponentLease lease_;
    void* stream_;
    std::string request_id_;
    ChunkCollector sink_;
    std::atomic<bool> cancelled_{false};
    bool announced_ = false, finished_ = false;
};

// A stream that only reports that the backend refused to start.
class RejectedStream : public UpstreamStream {
public:
    explicit RejectedStream(UpEvent e) : e_(std::move(e)) {}
    UpEvent next(milliseconds) override { return e_; }
    void cancel() override {}

private:
    UpEvent e_;
};

}  // namespace

std::string probe_http(const config::Endpoint& ep, double timeout_s) {
    try {
        Poco::URI uri(ep.url);
        std::string base = uri.getPath();
        while (!base.empty() && base.back() == '/') base.pop_back();
        Poco::Net::HTTPClientSession s(uri.getHost(), uri.getPort());
        Poco::Timespan t(static_cast<Poco::Timespan::TimeDiff>(timeout_s * 1e6));
        s.setTimeout(t, t, t);
        Poco::Net::HTTPRequest req(Poco::Net::HTTPRequest::HTTP_GET, base + "/models", Poco::Net::HTTPMessage::HTTP_1_1);
        s.sendRequest(req);
        Poco::Net::HTTPResponse resp;
        std::istream& in = s.receiveResponse(resp);
        char buf[4096];
        while (in.read(buf, sizeof buf).gcount() > 0) {
        }
        if (resp.getStatus() != Poco::Net::HTTPResponse::HTTP_OK)
            return "probe GET " + base + "/models answered HTTP " + std::to_string(static_cast<int>(resp.getStatus()));
        return {};
    } catch (const Poco::Exception& e) {
        return "probe failed: " + e.displayText();
    } catch (const std::exception& e) {
        return std::string("probe failed: ") + e.what();
    }
}

std::string BackendInstance::health() {
    const auto& vt = lease_->registration.backend;
    if (!vt.health) return {};
    pulse_call call;
    pulse_json_writer w;
    pulse_status_t rc = vt.health(backend_, &call, &w);
    return rc == PULSE_OK ? std::string() : host::call_error(call, rc, lease_->plugin_id());
}

std::unique_ptr<UpstreamStream> open_http(const config::Endpoint& ep, const pulse_upstream_req& req,
                                          const config::Upstream& timeouts) {
    return std::make_unique<HttpStream>(ep, req, timeouts);
}

BackendInstance::BackendInstance(plugin::ComponentLease lease, const std::string& options_json)
    : lease_(std::move(lease)) {
    rapidjson::Document opts;
    opts.Parse(options_json.c_str());
    pulse_call call;
    const auto& vt = lease_->registration.backend;
    pulse_status_t rc = vt.create(lease_->registration.user, &call, opts.IsNull() ? nullptr : host::view(&opts), &backend_);
    if (rc != PULSE_OK)
        throw std::runtime_error("backend '" + name() + "': create failed: " + host::call_error(call, rc, lease_->plugin_id()));
}

BackendInstance::~BackendInstance() {
    if (backend_ && lease_->registration.backend.destroy) lease_->registration.backend.destroy(backend_);
}

std::unique_ptr<UpstreamStream> BackendInstance::open(const std::string& request_json, const std::string& request_id) {
    rapidjson::Document doc;
    doc.Parse(request_json.c_str(), request_json.size());
    pulse_call call;
    call.request_id = request_id;
    void* stream = nullptr;
    const auto& vt = lease_->registration.backend;
    pulse_status_t rc = vt.stream_start(backend_, &call, host::view(&doc), &stream);
    if (rc != PULSE_OK) {
        UpEvent e;
        e.kind = UpEvent::Kind::rejected;
        e.status = rc;
        e.text = host::call_error(call, rc, lease_->plugin_id());
        return std::make_unique<RejectedStream>(std::move(e));
    }
    return std::make_unique<PluginStream>(lease_, stream, request_id);
}

}  // namespace pulse::gateway
