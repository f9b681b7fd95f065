// An HTTP endpoint (vLLM, llama-server, any OpenAI-compatible server): the request sent on a
// pooled keep-alive connection, and its answer read by the stream loop without blocking
// (HttpBody); the blocking exchanges of probes and preparatory requests.
#include "gateway/upstream/upstream.h"

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/NetException.h>
#include <Poco/URI.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <istream>
#include <map>
#include <mutex>
#include <optional>

#include "gateway/protocol/sse.h"
#include "gateway/upstream/liveness.h"
#include "gateway/upstream/upstream_failure.h"
#include "http/body.h"
#include "http/client.h"

namespace pulse::gateway {
namespace {

using namespace std::chrono;

using Session = Poco::Net::HTTPClientSession;
using http::BodyDecoder;
using http::ResponseHead;
using http::parse_response_head;

// Idle keep-alive connections per backend (host:port), so a request does not pay a TCP connect
// and the backend's per-connection set-up. A connection goes back only after a clean stream
// whose body was read to its end, and is used again only if it has been idle for less than
// kMaxIdleTime (under uvicorn's 5 s idle close). The idle time is counted here, from the
// stream's end: POCO's own keep-alive timeout counts from the request's start, which would
// retire every connection whose stream lasted longer than the timeout.
class SessionPool {
public:
    static constexpr auto kMaxIdleTime = std::chrono::seconds(2);

    std::unique_ptr<Session> take(const std::string& key) {
        const auto now = steady_clock::now();
        std::lock_guard lock(m_);
        auto& v = idle_[key];
        while (!v.empty()) {
            auto [s, since] = std::move(v.back());
            v.pop_back();
            if (now - since >= kMaxIdleTime || !s->connected()) continue;
            if (peer_closed(*s)) {
                ++closed_by_peer_[key];
                continue;
            }
            closed_by_peer_[key] = 0;
            return std::move(s);
        }
        return nullptr;
    }
    void give(const std::string& key, std::unique_ptr<Session> s) {
        const auto now = steady_clock::now();
        std::lock_guard lock(m_);
        // A backend that closed our idle connections twice in a row closes after every
        // response: pooling for it only races its close (a request sent as the FIN arrives).
        if (closed_by_peer_[key] >= 2) return;
        auto& v = idle_[key];
        // Oldest first: drop (close) those past the idle limit, which take() would never reach
        // while newer ones keep being used.
        auto stale = std::find_if(v.begin(), v.end(), [&](const auto& e) { return now - e.second < kMaxIdleTime; });
        v.erase(v.begin(), stale);
        if (v.size() < kMaxIdle) v.emplace_back(std::move(s), now);
    }

private:
    // An idle connection has nothing to read unless the backend closed it (EOF) or broke the
    // protocol: either way it cannot carry a request. llama-server closes its end after each
    // streamed response although it announces keep-alive; without this look, 29 of 30
    // back-to-back requests were first sent on a dead connection and sent again.
    static bool peer_closed(Session& s) {
        pollfd p{s.socket().impl()->sockfd(), POLLIN, 0};
        return ::poll(&p, 1, 0) != 0;
    }

    static constexpr size_t kMaxIdle = 64;
    std::mutex m_;
    std::map<std::string, std::vector<std::pair<std::unique_ptr<Session>, steady_clock::time_point>>> idle_;
    std::map<std::string, int> closed_by_peer_;  // idle connections found closed in a row, per backend
};

SessionPool& pool() {
    static SessionPool* p = new SessionPool();  // never destroyed: sessions may outlive main
    return *p;
}

// Parses Chat Completions SSE from `bytes` into data events and the `[DONE]` marker (which
// sets `done`; nothing after it counts).
template <class Events>
void feed_sse(SseParser& parser, std::string_view bytes, bool& done, Events& out) {
    parser.feed(bytes, [&](std::string_view, std::string_view data) {
        if (done) return;
        if (data == "[DONE]") {
            done = true;
            out.push_back(UpEvent{UpEvent::Kind::done, 0, PULSE_OK, {}, false, 0, {}});
        } else {
            out.push_back(UpEvent{UpEvent::Kind::data, 0, PULSE_OK, std::string(data), false, 0, {}});
        }
    });
}

// llama-server's prefill progress chunk (asked for with return_progress: a role-only delta
// with "prompt_progress": {total, cache, processed, time_ms}). True when `data` is one and
// carries nothing else: no text, no reasoning, no call, no finish.
bool read_progress(std::string_view data, UpEvent::Progress& p) {
    if (data.find("\"prompt_progress\"") == std::string_view::npos) return false;
    rapidjson::Document d;
    d.Parse(data.data(), data.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("prompt_progress") || !d["prompt_progress"].IsObject()) return false;
    const auto& pp = d["prompt_progress"];
    auto num = [&](const char* k) { return pp.HasMember(k) && pp[k].IsInt64() ? pp[k].GetInt64() : int64_t{0}; };
    p = {num("total"), num("cache"), num("processed"), num("time_ms")};
    if (d.HasMember("choices") && d["choices"].IsArray())
        for (const auto& c : d["choices"].GetArray()) {
            if (!c.IsObject()) continue;
            if (c.HasMember("finish_reason") && !c["finish_reason"].IsNull()) return false;
            if (!c.HasMember("delta") || !c["delta"].IsObject()) continue;
            for (const auto& [k, v] : c["delta"].GetObject()) {
                const std::string_view key(k.GetString(), k.GetStringLength());
                if (key != "role" && !v.IsNull() && !(v.IsString() && v.GetStringLength() == 0)) return false;
            }
        }
    return p.total > 0;
}

// Where and what to POST: built once per attempt.
struct RequestTarget {
    RequestTarget(const config::Endpoint& ep, const pulse_upstream_req& req, const config::Upstream& t)
        : uri(ep.url), body(req.body.text()), headers(req.headers), timeouts(t) {
        key = uri.getHost() + ":" + std::to_string(uri.getPort());
        std::string base = uri.getPath();
        while (!base.empty() && base.back() == '/') base.pop_back();
        path = req.root_path ? req.path : base + req.path;
    }
    Poco::URI uri;
    std::string key, path;
    std::string_view body;  // the profile's writer holds it for the whole request
    std::vector<std::pair<std::string, std::string>> headers;
    config::Upstream timeouts;
};

void send_request(Session& s, const RequestTarget& t) {
    Poco::Net::HTTPRequest request(Poco::Net::HTTPRequest::HTTP_POST, t.path, Poco::Net::HTTPMessage::HTTP_1_1);
    request.setContentType("application/json");
    request.set("Accept", "text/event-stream");
    request.setContentLength(static_cast<std::streamsize>(t.body.size()));
    for (const auto& [k, v] : t.headers) request.set(k, v);
    std::ostream& os = s.sendRequest(request);
    os.write(t.body.data(), static_cast<std::streamsize>(t.body.size()));
    os.flush();
    if (!os.good()) throw Poco::IOException("sending the request failed");
}

// Sends the request on an idle pooled connection (unless !from_pool) or a new one, bounded by
// the connect and send timeouts. `reused` says which. Throws Poco::Exception.
std::unique_ptr<Session> connect_and_send(const RequestTarget& t, bool from_pool, bool& reused) {
    reused = false;
    if (from_pool) {
        if (auto s = pool().take(t.key)) {
            try {
                send_request(*s, t);
                reused = true;
                return s;
            } catch (const Poco::Exception&) {
                // The backend closed the idle connection: a fresh one below.
            }
        }
    }
    // The receive timeout only bounds reads that poll() said would not block.
    auto s = http::session(t.uri, http::Timeouts{t.timeouts.connect_timeout_s, 30, t.timeouts.idle_timeout_s});
    s->setKeepAlive(true);
    // Idle time is the pool's to judge (SessionPool); POCO's timer would run from the request.
    s->setKeepAliveTimeout(Poco::Timespan(365LL * 24 * 3600, 0));
    send_request(*s, t);
    return s;
}

// A sent request's response, read by the stream loop: raw recv(MSG_DONTWAIT) on the socket,
// the response head, HTTP framing, then SSE.
class HttpBody : public DetachedBody {
public:
    HttpBody(std::unique_ptr<Session> s, std::string key, bool reused, const config::Upstream& t, const config::Endpoint& ep, Liveness* liveness,
             steady_clock::time_point window_end)
        : session_(std::move(s)), key_(std::move(key)), fd_(session_->socket().impl()->sockfd()), reused_(reused), ep_(ep),
          window_end_(window_end), retry_window_s_(t.retry_window_s), stall_after_s_(t.stall_after_s),
          liveness_(t.liveness_after_s > 0 ? liveness : nullptr), liveness_after_s_(t.liveness_after_s), liveness_timeout_s_(t.liveness_timeout_s),
          idle_(duration_cast<steady_clock::duration>(duration<double>(t.idle_timeout_s))), idle_timeout_s_(t.idle_timeout_s),
          head_deadline_(steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(t.head_timeout_s))),
          head_timeout_s_(t.head_timeout_s) {}

    int fd() const override { return fd_; }

    void read(std::vector<UpEvent>& out) override {
        // Bounded per call, so one fast stream cannot keep the loop from the others; level-
        // triggered epoll calls again for what is left.
        char buf[16384];
        for (int i = 0; i < 4 && !exhausted_; ++i) {
            ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
            if (n > 0) {
                got_bytes_ = true;
                last_byte_ = steady_clock::now();
                consume(std::string_view(buf, static_cast<size_t>(n)), out);
                if (static_cast<size_t>(n) < sizeof buf) break;  // drained: skip the EAGAIN syscall
            } else if (n == 0) {
                exhausted_ = true;
                at_end(out, "the connection was closed");
            } else if (errno == EINTR) {
                continue;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                exhausted_ = true;
                at_end(out, std::strerror(errno));
            } else {
                break;
            }
        }
    }

    steady_clock::time_point idle_deadline() const override {
        const auto hard = silence_limit();
        const auto window = waiting_for_output() ? window_end_ : steady_clock::time_point::max();
        return std::min({window, stall_at(), hard == steady_clock::time_point::max() || !liveness_ ? hard : std::min(hard, liveness_check_at())});
    }
    std::optional<UpEvent> silence(steady_clock::time_point now) override {
        const auto hard = silence_limit();
        if (now >= hard) {
            if (phase_ == Phase::head)
                return failure(false, "no response head from the backend within " + seconds_text(head_timeout_s_) + " s (upstream.head_timeout_s)");
            return failure(true, "no data from the backend for " + seconds_text(idle_timeout_s_) + " s (upstream.idle_timeout_s)");
        }
        // A prefill that reported progress and then made none for stall_after_s: stalled (an
        // engine that stopped while its HTTP side still answers), not slow.
        if (now >= stall_at()) {
            char what[160];
            std::snprintf(what, sizeof what, "the backend's prefill stalled at %lld of %lld prompt tokens: no progress for %g s (upstream.stall_after_s)",
                          static_cast<long long>(prefill_.processed), static_cast<long long>(prefill_.total), stall_after_s_);
            return failure(phase_ == Phase::body, what);
        }
        // The retry window is a deadline the client can count on: an attempt with nothing to
        // show by then is cut, unless its endpoint proved alive while it waited (a long prefill).
        if (waiting_for_output() && now >= window_end_) {
            window_end_ = steady_clock::time_point::max();  // decided once
            if (!liveness_ || !liveness_->answered_since(ep_, last_byte_))
                return failure(phase_ == Phase::body, "the retry window (upstream.retry_window_s = " + seconds_text(retry_window_s_) +
                                                          " s) ended with no answer from this endpoint, which had not shown it was alive");
        }
        if (!liveness_ || hard == steady_clock::time_point::max() || now < liveness_check_at()) return std::nullopt;
        if (std::string why = liveness_->frozen(ep_, last_byte_, liveness_after_s_, liveness_timeout_s_); !why.empty())
            return failure(phase_ == Phase::body, why);
        next_check_ = now + milliseconds(250);  // until the probe has answered
        return std::nullopt;
    }
    bool reusable() const override { return done_ && framing_.complete() && !broken_ && !close_; }
    bool ended() const override { return done_; }
    bool exhausted() const override { return exhausted_ || framing_.complete(); }
    void recycle() override {
        if (reusable() && session_) pool().give(key_, std::move(session_));
    }

private:
    enum class Phase { head, body, rejected, over };
    static constexpr size_t kMaxHead = 64 * 1024, kMaxRejectBody = 64 * 1024;

    // When silence fails the request outright: the head timeout, then the idle timeout.
    steady_clock::time_point silence_limit() const {
        if (phase_ == Phase::head) return head_deadline_;  // a backend that took the request but never answers
        return phase_ != Phase::body || done_ || exhausted_ ? steady_clock::time_point::max() : last_byte_ + idle_;
    }
    // When a prefill that stopped progressing counts as stalled (max: none under way).
    steady_clock::time_point stall_at() const {
        if (stall_after_s_ <= 0 || prefill_.total == 0 || generating_ || done_ || exhausted_ || prefill_.processed >= prefill_.total)
            return steady_clock::time_point::max();
        return progress_at_ + duration_cast<steady_clock::duration>(duration<double>(stall_after_s_));
    }
    // No SSE data yet: what the client has of this attempt is at most keepalives.
    bool waiting_for_output() const { return phase_ == Phase::head || (phase_ == Phase::body && !data_seen_ && !done_ && !exhausted_); }
    // When the endpoint's liveness is asked about next: liveness_after_s into a silence.
    steady_clock::time_point liveness_check_at() const {
        return std::max(next_check_, last_byte_ + duration_cast<steady_clock::duration>(duration<double>(liveness_after_s_)));
    }

    static UpEvent failure(bool accepted, const std::string& what) { return upstream_failure(accepted, what); }
    void fail(std::vector<UpEvent>& out, const std::string& what) {
        broken_ = exhausted_ = true;
        out.push_back(failure(phase_ == Phase::body, what));
        phase_ = Phase::over;
    }

    // EOF or a socket error.
    void at_end(std::vector<UpEvent>& out, const std::string& why) {
        switch (phase_) {
            case Phase::head: {
                broken_ = true;
                UpEvent e = failure(false, "no response (" + why + ")");
                // A pooled connection the backend had closed while idle: nothing was processed.
                e.stale = reused_ && !got_bytes_;
                out.push_back(std::move(e));
                phase_ = Phase::over;
                return;
            }
            case Phase::rejected:
                framing_.at_eof();
                return reject(out);
            case Phase::body:
                if (done_) return;
                fail(out, framing_.at_eof() ? "the backend stream ended without its terminal [DONE] marker"
                                            : "the backend closed the connection in the middle of the response body (" + why + ")");
                return;
            case Phase::over: return;
        }
    }

    void consume(std::string_view raw, std::vector<UpEvent>& out) {
        if (phase_ == Phase::head) {
            head_.append(raw);
            size_t end;
            while (phase_ == Phase::head && (end = head_.find("\r\n\r\n")) != std::string::npos) {
                std::string rest = head_.substr(end + 4);
                head_.resize(end);
                if (!parse_head()) return fail(out, "malformed response head from the backend");
                if (status_ / 100 == 1) {  // interim (100 Continue): the real head follows
                    head_ = std::move(rest);
                    continue;
                }
                if (status_ == 200) {
                    phase_ = Phase::body;
                    out.push_back(UpEvent{UpEvent::Kind::accepted, 200, PULSE_OK, {}, false, 0, {}});
                } else {
                    phase_ = Phase::rejected;
                }
                head_.clear();
                if (!rest.empty()) consume(rest, out);
                return;
            }
            if (phase_ == Phase::head && head_.size() > kMaxHead) fail(out, "response head over 64 KiB");
            return;
        }
        if (phase_ == Phase::rejected) {
            if (!framing_.feed(raw, text_) || framing_.complete() || text_.size() >= kMaxRejectBody) reject(out);
            return;
        }
        if (phase_ != Phase::body) return;
        body_.clear();
        if (!framing_.feed(raw, body_)) {
            if (!done_) return fail(out, "bad HTTP framing: " + framing_.error());
            broken_ = exhausted_ = true;  // after [DONE]: the answer is whole, only the connection is spoiled
            return;
        }
        if (done_) return;  // after the terminal marker only the body's end matters
        const bool body_over = framing_.complete();
        const size_t before = out.size();
        feed_sse(parser_, body_, done_, out);
        if (out.size() > before) data_seen_ = true;
        for (size_t i = before; i < out.size(); ++i) {
            if (out[i].kind != UpEvent::Kind::data) continue;
            if (UpEvent::Progress p; read_progress(out[i].text, p)) {
                out[i].kind = UpEvent::Kind::progress;
                out[i].progress = p;
                out[i].text.clear();
                if (p.processed > prefill_.processed || prefill_.total == 0) progress_at_ = steady_clock::now();
                prefill_ = p;
            } else {
                generating_ = true;  // output (or the first chunk after the prompt): the prefill is over
            }
        }
        if (parser_.overflowed() && !done_) return fail(out, "the backend sent an SSE line over 16 MiB");
        // A keep-alive connection does not close after the body: its end is the end.
        if (body_over && !done_) fail(out, "the backend stream ended without its terminal [DONE] marker");
    }

    void reject(std::vector<UpEvent>& out) {
        UpEvent e;
        e.kind = UpEvent::Kind::rejected;
        e.http_status = status_;
        e.retry_after_s = retry_after_s_;
        e.text = text_.substr(0, kMaxRejectBody);
        out.push_back(std::move(e));
        broken_ = exhausted_ = true;
        phase_ = Phase::over;
    }

    bool parse_head() {
        ResponseHead h;
        if (!parse_response_head(head_, h)) return false;
        status_ = h.status;
        close_ = h.close;
        retry_after_s_ = h.retry_after_s;
        framing_ = h.decoder();
        return true;
    }

    std::unique_ptr<Session> session_;
    std::string key_;
    int fd_;
    bool reused_;
    config::Endpoint ep_;
    steady_clock::time_point window_end_;  // max: no retry window, or decided
    double retry_window_s_;
    double stall_after_s_;
    UpEvent::Progress prefill_;              // the last progress reported
    steady_clock::time_point progress_at_{};  // when it last advanced
    bool generating_ = false;                 // a chunk other than progress came
    Liveness* liveness_;  // null: silence is judged by the timeouts alone
    double liveness_after_s_, liveness_timeout_s_;
    steady_clock::time_point next_check_{};
    Phase phase_ = Phase::head;
    int status_ = 0;
    std::string head_, body_, text_;
    BodyDecoder framing_{http::Framing::until_close};
    SseParser parser_;
    steady_clock::duration idle_;
    double idle_timeout_s_;
    steady_clock::time_point head_deadline_;
    double head_timeout_s_;
    int retry_after_s_ = 0;
    steady_clock::time_point last_byte_ = steady_clock::now();
    bool done_ = false, broken_ = false, exhausted_ = false, close_ = false, got_bytes_ = false, data_seen_ = false;
};

}  // namespace

ProbeAnswer get_models(const config::Endpoint& ep, double timeout_s) {
    ProbeAnswer a;
    a.path = http::under(ep.url, "/models");
    http::Request req;
    req.target = a.path;
    http::Answer got = http::fetch(ep.url, req, http::Timeouts::all(timeout_s), 65536);
    a.answered = got.status != 0;
    a.status = got.status;
    a.body = std::move(got.body);
    a.error = std::move(got.error);
    return a;
}

std::vector<std::string> listed_models(std::string_view body) {
    std::vector<std::string> ids;
    rapidjson::Document d;
    d.Parse(body.data(), body.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("data") || !d["data"].IsArray()) return ids;
    for (const auto& m : d["data"].GetArray())
        if (m.IsObject() && m.HasMember("id") && m["id"].IsString()) ids.emplace_back(m["id"].GetString(), m["id"].GetStringLength());
    return ids;
}

bool serves_only_listed(std::string_view body) {
    rapidjson::Document d;
    d.Parse(body.data(), body.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("data") || !d["data"].IsArray() || d["data"].Empty()) return false;
    for (const auto& m : d["data"].GetArray())
        if (!m.IsObject() || !m.HasMember("owned_by") || !m["owned_by"].IsString() || std::string_view(m["owned_by"].GetString()) != "vllm") return false;
    return true;
}

std::string probe_http(const config::Endpoint& ep, double timeout_s, const BackendDialect& dialect, std::string* body) {
    ProbeAnswer a = get_models(ep, timeout_s);
    if (body) *body = a.body;
    if (!a.answered) return "probe failed: " + a.error;
    return dialect.probe(a.status, a.body, a.path);
}

int exchange_blocking(const config::Endpoint& ep, const pulse_upstream_req& req, http::Timeouts t, size_t max_answer, std::string* answer) {
    RequestTarget target(ep, req, config::Upstream{});
    http::Request r;
    r.method = req.method;
    r.target = target.path;
    if (req.method != "GET") r.body = target.body;
    r.fields = target.headers;
    http::Answer a = http::fetch(ep.url, r, t, max_answer);
    *answer = a.status ? std::move(a.body) : std::move(a.error);
    return a.status;
}

int post_prepared(const config::Endpoint& ep, const pulse_upstream_req& req, const config::Upstream& timeouts, std::string* answer) {
    // Rendering a prompt takes no inference: a server that has not answered in 30 s (or
    // head_timeout_s, if shorter) is frozen or overloaded, and the next endpoint is tried. A
    // rendered prompt is about the size of the request: bounded by 64 MiB like a body.
    return exchange_blocking(ep, req, http::Timeouts{timeouts.connect_timeout_s, 30, std::min(timeouts.head_timeout_s, 30.0)}, 64u << 20, answer);
}

std::unique_ptr<DetachedBody> send_http(const config::Endpoint& ep, const pulse_upstream_req& req, const config::Upstream& timeouts,
                                        bool fresh, UpEvent& error, Liveness* liveness, steady_clock::time_point window_end) {
    RequestTarget t(ep, req, timeouts);
    try {
        bool reused = false;
        auto s = connect_and_send(t, !fresh, reused);
        return std::make_unique<HttpBody>(std::move(s), t.key, reused, timeouts, ep, liveness, window_end);
    } catch (const Poco::Exception& e) {
        error = upstream_failure(false, e.displayText());
    } catch (const std::exception& e) {
        error = upstream_failure(false, e.what());
    }
    return nullptr;
}

}  // namespace pulse::gateway
