// POST /v1/responses: validate, translate, send to the first endpoint that takes the request
// (retrying across endpoints with backoff inside the retry window while nothing has been
// sent), stream the translated events back (or aggregate them for stream:false).
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerRequestImpl.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/StreamSocket.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <istream>
#include <optional>
#include <random>
#include <thread>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "common/log.h"
#include "common/metrics.h"
#include "gateway/gateway.h"
#include "gateway/http_util.h"
#include "gateway/responses_api.h"
#include "gateway/sse.h"

namespace pulse::gateway {
namespace {

using namespace std::chrono;

std::string new_response_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    static const char* hex = "0123456789abcdef";
    std::string s = "resp_";
    for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
    return s;
}

struct HttpError {
    int status;
    const char* type;
    const char* code;
    int retry_after;
};

// How a plugin status reaches an HTTP client that has not seen any event yet. Upstream
// failures are 502/503 (Codex retries those and shows our message), never 500.
HttpError http_error_for(pulse_status_t s) {
    switch (s) {
        case PULSE_E_INVALID_ARGUMENT:
        case PULSE_E_UNSUPPORTED: return {400, "invalid_request_error", "invalid_request", 0};
        case PULSE_E_CONTEXT_LENGTH: return {400, "invalid_request_error", "context_length_exceeded", 0};
        case PULSE_E_UNAVAILABLE:
        case PULSE_E_RESOURCE_EXHAUSTED: return {503, "server_error", "backend_unavailable", 1};
        case PULSE_E_DEADLINE: return {504, "server_error", "timeout", 1};
        default: return {502, "server_error", "bad_gateway", 1};
    }
}

bool retryable(pulse_status_t s) { return s == PULSE_E_UNAVAILABLE || s == PULSE_E_RESOURCE_EXHAUSTED; }

// The client closed its end: the socket is readable and has nothing to read.
bool client_gone(Poco::Net::StreamSocket& s) {
    try {
        pollfd p{s.impl()->sockfd(), POLLIN, 0};
        return ::poll(&p, 1, 0) > 0 && ((p.revents & (POLLHUP | POLLERR)) || s.available() == 0);
    } catch (...) {
        return true;
    }
}

// Appends one JSON line to the trace file (created 0600: it holds whole prompts).
void trace(const std::string& file, const std::string& id, const char* what, const std::string& json) {
    static std::mutex m;
    std::lock_guard lock(m);
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return;
    std::string line = "{\"id\":\"" + id + "\",\"what\":\"" + what + "\",\"body\":" + (json.empty() ? "null" : json) + "}\n";
    ssize_t n = ::write(fd, line.data(), line.size());
    (void)n;
    ::close(fd);
}

}  // namespace

// One /v1/responses request from receipt to the last byte.
class ResponseSession : public RelayJob {
public:
    ResponseSession(Gateway& gw, Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp)
        : gw_(gw), req_(req), resp_(resp), snap_(gw.snapshot()), cfg_(snap_->cfg), id_(new_response_id()) {}

    void run() {
        if (!read_and_validate()) return;
        if (!translate()) return;
        serve();
        finish();
    }

private:
    // again: the same endpoint once more on a fresh connection (a pooled one had gone stale).
    enum class Attempt { served, retry, final, again };

    bool read_and_validate() {
        const int64_t limit = cfg_.server.max_body_bytes;
        auto too_large = [&](const std::string& size) {
            discard_body(req_, resp_);
            invalid({413, "request body " + size + "is over the limit of " + std::to_string(limit) + " bytes (server.max_body_bytes)", "",
                     "request_too_large"});
            return false;
        };
        if (req_.hasContentLength() && req_.getContentLength64() > limit)
            return too_large("of " + std::to_string(req_.getContentLength64()) + " bytes ");
        std::string body;
        std::istream& in = req_.stream();
        char buf[65536];
        while (has_body(req_) && (in.read(buf, sizeof buf) || in.gcount() > 0)) {
            body.append(buf, static_cast<size_t>(in.gcount()));
            if (static_cast<int64_t>(body.size()) > limit) return too_large("");
        }
        if (auto e = parse_body(body, doc_)) return invalid(*e), false;
        // Traced once it is known to be JSON, so every trace line stays valid JSON.
        if (!cfg_.server.trace_file.empty()) {
            rapidjson::StringBuffer compact;  // one line, whatever whitespace the client sent
            rapidjson::Writer<rapidjson::StringBuffer> w(compact);
            doc_.Accept(w);
            trace(cfg_.server.trace_file, id_, "request", std::string(compact.GetString(), compact.GetSize()));
        }
        if (auto e = validate_request(doc_)) return invalid(*e), false;

        model_id_ = doc_["model"].GetString();
        rt_ = snap_->find(model_id_);
        if (!rt_) {
            std::string known;
            for (const auto& r : snap_->models) known += (known.empty() ? "" : ", ") + r->cfg->id;
            invalid({400, "model '" + model_id_ + "' is not configured here (models: " + (known.empty() ? "none" : known) + ")",
                     "model", "model_not_found"});
            return false;
        }
        streaming_ = doc_.HasMember("stream") && doc_["stream"].IsTrue();
        if (auto k = doc_.FindMember("prompt_cache_key"); k != doc_.MemberEnd() && k->value.IsString()) cache_key_ = k->value.GetString();
        return true;
    }

    void invalid(const RequestError& e) {
        resp_.setKeepAlive(false);  // a client that sent garbage gets no second chance on this connection
        metrics::global().counter("pulse_invalid_requests_total", "requests refused with a 4xx before translation", {{"code", e.code}}).add();
        send_error(resp_, e.http_status, "invalid_request_error", e.message, e.param, e.code);
        outcome_ = "invalid";
    }

    bool translate() {
        vt_ = &rt_->profile->registration.translation;
        call_.request_id = id_;
        call_.cancelled = &cancelled_;
        pulse_status_t rc = vt_->build_request(rt_->instance, &call_, host::view(&doc_), host::view(&rt_->view), &upreq_);
        if (rc == PULSE_OK && !upreq_.body.complete()) {
            rc = PULSE_E_INTERNAL;
            call_.message = "profile '" + rt_->profile->registration.name + "' wrote an incomplete upstream request";
            call_.has_message = true;
        }
        if (rc == PULSE_OK) {
            call_.reset();
            rc = vt_->stream_open(rt_->instance, &call_, host::view(&doc_), &stream_);
        }
        if (rc != PULSE_OK) {
            auto h = http_error_for(rc);
            std::string msg = host::call_error(call_, rc, rt_->profile->plugin_id());
            if (h.status >= 500) log::error("responses", id_ + ": " + msg);
            send_error(resp_, h.status, h.type, msg, {}, h.code, h.retry_after);
            outcome_ = "rejected";
            return false;
        }
        upstream_body_ = std::string(upreq_.body.text());
        builder_ = std::make_unique<ResponseBuilder>(id_, model_id_, rt_->reasoning, [this](std::string_view type, std::string_view json) {
            emit(type, json);
        });
        socket_ = &static_cast<Poco::Net::HTTPServerRequestImpl&>(req_).socket();
        socket_->setSendTimeout(Poco::Timespan(static_cast<Poco::Timespan::TimeDiff>(cfg_.server.send_timeout_s * 1e6)));
        keepalive_ = milliseconds(static_cast<int64_t>(cfg_.upstream.keepalive_s * 1000));
        return true;
    }

    void emit(std::string_view type, std::string_view json) {
        if (!streaming_ || lost_) return;
        last_event_ = steady_clock::now();
        if (relay_ || raw_) {  // framed by take_output, sent by the stream loop or by flush()
            relay_out_ += "event: ";
            relay_out_ += type;
            relay_out_ += "\ndata: ";
            relay_out_ += json;
            relay_out_ += "\n\n";
            return;
        }
        if (!out_) open_poco_stream();
        std::string ev = sse_event(type, json);
        out_->write(ev.data(), static_cast<std::streamsize>(ev.size()));
        unflushed_ = true;
        if (!out_->good()) lost_ = true;
        // No flush here: the attempt loop flushes whenever the upstream has nothing more queued,
        // so events that arrive together leave in one write.
    }

    void open_poco_stream() {
        resp_.setStatusAndReason(Poco::Net::HTTPResponse::HTTP_OK);
        resp_.setContentType("text/event-stream");
        resp_.set("Cache-Control", "no-cache");
        resp_.set("X-Accel-Buffering", "no");
        resp_.setChunkedTransferEncoding(true);
        out_ = &resp_.send();
    }

    void flush() {
        if (raw_ && !relay_ && !lost_) {
            std::string wire;
            take_output(wire);
            write_raw(wire);
            return;
        }
        if (relay_ || !out_ || !unflushed_ || lost_) return;
        out_->flush();
        unflushed_ = false;
        if (!out_->good()) lost_ = true;
    }

    // Bytes for the client written the blocking way (send timeout), past POCO's streams.
    void write_raw(const std::string& wire) {
        if (wire.empty() || lost_) return;
        try {
            socket_->sendBytes(wire.data(), static_cast<int>(wire.size()));
        } catch (const Poco::Exception&) {
            lost_ = true;
        }
    }

    void keepalive_if_due() {
        if (!streaming_ || steady_clock::now() - last_event_ < keepalive_) return;
        builder_->keepalive();
        flush();
        metrics::global().counter("pulse_keepalives_total", "response.in_progress keepalive events sent", {{"model", model_id_}}).add();
    }

    // Sends the request to endpoint `i` and follows it to the end, or to the point where
    // another endpoint should be tried. An HTTP endpoint's response is read by the stream loop
    // (relay()) once the request is sent; a backend plugin's stream is followed on this thread.
    Attempt attempt(size_t i) {
        const EndpointRef& ep = rt_->endpoints[i];
        InFlight in_flight(*ep.health);
        accepted_ = fed_ = false;
        if (!ep.backend && gw_.relay_) {
            for (bool fresh = false;; fresh = true) {
                UpEvent error;
                std::unique_ptr<DetachedBody> body = send_http(*ep.cfg, upreq_, cfg_.upstream, fresh, error);
                Attempt a = body ? relay(std::move(body), ep) : on_event(std::move(error), ep, nullptr).value_or(Attempt::retry);
                if (a != Attempt::again || fresh) return a == Attempt::again ? Attempt::retry : a;
                log::info("upstream", "the backend had closed the pooled connection to " + ep.cfg->name + "; sending again on a fresh one");
            }
        }
        std::unique_ptr<UpstreamStream> up = ep.backend ? ep.backend->open(upstream_body_, id_) : open_http(*ep.cfg, upreq_, cfg_.upstream);
        for (;;) {
            // Drain what is already queued before flushing: under load many tokens go out in
            // one write instead of one syscall each.
            UpEvent e = up->next(milliseconds(0));
            if (e.kind == UpEvent::Kind::timeout) {
                flush();
                e = up->next(keepalive_);
            }
            if (!lost_ && steady_clock::now() - last_gone_check_ > milliseconds(100)) {
                last_gone_check_ = steady_clock::now();
                if (client_gone(*socket_)) lost_ = true;
            }
            if (lost_) {
                up->cancel();
                return cancel_stream();
            }
            if (auto a = on_event(std::move(e), ep, up.get())) return *a;
        }
    }

    Attempt cancel_stream() {
        call_.reset();
        vt_->stream_finish(stream_, &call_, PULSE_STREAM_CANCELLED, builder_.get());
        outcome_ = "cancelled";
        return Attempt::final;
    }

    // One event from endpoint `ep`; a value when the attempt is over. `up` is null when the
    // stream loop drives the stream (it closes the connection itself).
    std::optional<Attempt> on_event(UpEvent e, const EndpointRef& ep, UpstreamStream* up) {
        switch (e.kind) {
            case UpEvent::Kind::timeout:
                keepalive_if_due();
                return std::nullopt;
            case UpEvent::Kind::accepted:
                accepted_ = true;
                served_by_ = ep.cfg->name;
                gw_.endpoint_ok(model_id_, ep);
                builder_->start();
                return std::nullopt;
            case UpEvent::Kind::rejected: {
                pulse_status_t s = e.status;
                call_.reset();
                if (e.http_status) {
                    s = vt_->map_error ? vt_->map_error(rt_->instance, &call_, e.http_status, pulse_str_t{e.text.data(), e.text.size()})
                                       : (e.http_status >= 500 || e.http_status == 429 ? PULSE_E_UNAVAILABLE : PULSE_E_INVALID_ARGUMENT);
                    last_error_ = call_.has_message ? call_.message
                                                    : "backend answered HTTP " + std::to_string(e.http_status) + ": " + e.text.substr(0, 300);
                } else {
                    last_error_ = e.text;
                }
                last_status_ = s;
                log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " refused the request: " + last_error_);
                if (!retryable(s)) return Attempt::final;
                gw_.endpoint_failed(ep, last_error_);
                return Attempt::retry;
            }
            case UpEvent::Kind::failed:
                if (e.stale) return Attempt::again;
                last_status_ = e.status ? e.status : PULSE_E_UNAVAILABLE;
                last_error_ = e.text;
                if (!accepted_ || e.before_accept || !fed_) {
                    // No output came from this endpoint: another one (or this one, later) may serve it.
                    log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed: " + e.text);
                    gw_.endpoint_failed(ep, e.text);
                    return Attempt::retry;
                }
                call_.reset();
                vt_->stream_finish(stream_, &call_, PULSE_STREAM_TRUNCATED, builder_.get());
                outcome_ = builder_->end(PULSE_STREAM_TRUNCATED, e.text);
                return Attempt::served;
            case UpEvent::Kind::data: {
                if (!ttft_) ttft_ = duration_cast<milliseconds>(steady_clock::now() - t0_);
                fed_ = true;
                call_.reset();
                pulse_status_t s = vt_->stream_feed(stream_, &call_, {e.text.data(), e.text.size()}, builder_.get());
                if (s < 0) {
                    builder_->fail(s, host::call_error(call_, s, rt_->profile->plugin_id()));
                    outcome_ = "failed";
                    if (up) up->cancel();
                    return Attempt::served;
                }
                keepalive_if_due();
                return std::nullopt;
            }
            case UpEvent::Kind::done: {
                call_.reset();
                pulse_status_t s = vt_->stream_finish(stream_, &call_, PULSE_STREAM_CLEAN, builder_.get());
                if (s < 0) builder_->fail(s, host::call_error(call_, s, rt_->profile->plugin_id()));
                outcome_ = builder_->ended() ? (builder_->failure() ? "failed" : "completed") : builder_->end(PULSE_STREAM_CLEAN);
                if (outcome_ == "completed" || outcome_ == "incomplete")
                    gw_.prefixes_->remember(model_id_, prefix_key(cache_key_, upstream_body_), upstream_body_);
                return Attempt::served;
            }
        }
        return std::nullopt;
    }

    // A sent HTTP request's response, followed by the stream loop while this thread sleeps.
    Attempt relay(std::unique_ptr<DetachedBody> body, const EndpointRef& ep) {
        if (streaming_ && !out_ && !raw_) {
            // Nothing sent yet: the loop writes the HTTP head itself, with the first events,
            // in one send. (An HTTP/1.0 client gets POCO's framing, opened here.)
            if (req_.getVersion() == Poco::Net::HTTPMessage::HTTP_1_1)
                raw_ = true;
            else
                open_poco_stream();
        }
        flush();
        if (lost_) return cancel_stream();  // `body` closes the connection
        relay_ep_ = &ep;
        relay_result_.reset();
        relay_ = true;
        std::string unsent;
        gw_.relay_->run(*this, std::move(body), unsent);
        relay_ = false;
        Attempt a = relay_result_.value_or(Attempt::final);
        // The attempt's last events: before another attempt they leave now; at the response's
        // end they wait for the last chunk, so both cost the client one wake-up, not two.
        if (raw_ && a != Attempt::retry && a != Attempt::again)
            tail_ += unsent;
        else
            write_raw(unsent);
        return a;
    }

public:  // RelayJob: called on the stream loop's thread while relay() waits
    int client_fd() const override { return socket_->impl()->sockfd(); }
    bool on_upstream(UpEvent e) override {
        relay_result_ = on_event(std::move(e), *relay_ep_, nullptr);
        return relay_result_.has_value();
    }
    bool on_timer() override {
        keepalive_if_due();
        return false;
    }
    steady_clock::time_point next_timer() const override { return streaming_ ? last_event_ + keepalive_ : steady_clock::time_point::max(); }
    void on_client_lost() override {
        lost_ = true;
        relay_result_ = cancel_stream();
    }
    void take_output(std::string& wire) override {
        if (relay_out_.empty()) return;
        if (raw_ && !head_sent_) {
            head_sent_ = true;
            wire += "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n";
        }
        char size[24];  // the chunk size in hex, then CRLF (a formatter here: snprintf showed in profiles)
        char* p = size + sizeof size;
        *--p = '\n';
        *--p = '\r';
        size_t v = relay_out_.size();
        do {
            *--p = "0123456789abcdef"[v & 15];
            v >>= 4;
        } while (v);
        wire.append(p, static_cast<size_t>(size + sizeof size - p));
        wire += relay_out_;
        wire += "\r\n";
        relay_out_.clear();
    }
    steady_clock::duration send_timeout() const override {
        return duration_cast<steady_clock::duration>(duration<double>(cfg_.server.send_timeout_s));
    }

private:
    // Waits before the next round, keeping the client alive and noticing if it leaves.
    void wait_backoff(milliseconds d) {
        auto until = steady_clock::now() + d;
        while (!lost_ && steady_clock::now() < until) {
            std::this_thread::sleep_for(std::min<milliseconds>(milliseconds(50), duration_cast<milliseconds>(until - steady_clock::now())));
            if (client_gone(*socket_)) lost_ = true;
            keepalive_if_due();
        }
    }

    void serve() {
        auto deadline = t0_ + duration_cast<steady_clock::duration>(duration<double>(cfg_.upstream.retry_window_s));
        milliseconds backoff(250);
        for (int round = 0;; ++round) {
            Attempt a = Attempt::retry;
            auto order = rt_->order();
            for (size_t n = 0; n < order.size() && a == Attempt::retry && !lost_; ++n) {
                if (round > 0 || n > 0) {
                    metrics::global()
                        .counter(round > 0 && n == 0 ? "pulse_retries_total" : "pulse_failovers_total",
                                 round > 0 && n == 0 ? "request rounds started again after every endpoint failed"
                                                     : "requests moved to the next endpoint before any output",
                                 {{"model", model_id_}})
                        .add();
                }
                a = attempt(order[n]);
            }
            if (a != Attempt::retry || lost_) {
                if (lost_ && outcome_.empty()) outcome_ = "cancelled";
                break;
            }
            if (steady_clock::now() + backoff >= deadline) break;  // the window is spent
            wait_backoff(backoff);
            backoff = std::min(backoff * 2, milliseconds(5000));
        }
        if (outcome_.empty()) outcome_ = retryable(last_status_) ? "unavailable" : "rejected";
    }

    void finish() {
        if (outcome_ == "unavailable" || outcome_ == "rejected") {
            std::string msg = outcome_ == "unavailable"
                                  ? "no backend could take the request within " + std::to_string(static_cast<int>(cfg_.upstream.retry_window_s)) +
                                        " s; last error: " + last_error_
                                  : last_error_;
            if (builder_->started()) {
                builder_->fail(last_status_, msg);  // SSE already open (keepalives): a terminal event
            } else if (!lost_) {
                auto h = http_error_for(last_status_);
                send_error(resp_, h.status, h.type, msg, {}, h.code, h.retry_after);
            }
        } else if (!streaming_ && !lost_ && outcome_ != "cancelled") {
            if (auto f = builder_->failure(); f && !builder_->has_output()) {
                auto h = http_error_for(f->first);
                send_error(resp_, h.status, h.type, f->second, {}, f->first == PULSE_E_CONTEXT_LENGTH ? "context_length_exceeded" : h.code,
                           h.retry_after);
            } else {
                send_json(resp_, 200, builder_->final_response());
            }
        }
        if (raw_ && !lost_)
            take_output(tail_);  // leaves with the last chunk
        else
            flush();
        if (!cfg_.server.trace_file.empty() && builder_->ended()) trace(cfg_.server.trace_file, id_, "response", builder_->final_response());
    }

public:
    ~ResponseSession() {
        if (stream_) vt_->stream_close(stream_);
        if (outcome_ == "invalid") return;  // counted in pulse_invalid_requests_total
        auto& reg = metrics::global();
        const std::string ep = served_by_.empty() ? "-" : served_by_;
        reg.counter("pulse_requests_total", "Responses requests by model, endpoint and outcome",
                    {{"model", model_id_}, {"endpoint", ep}, {"outcome", outcome_.empty() ? "error" : outcome_}})
            .add();
        double total_s = duration<double>(steady_clock::now() - t0_).count();
        reg.histogram("pulse_request_duration_seconds", "whole request, receipt to last byte", {{"model", model_id_}}).observe(total_s);
        if (ttft_) reg.histogram("pulse_ttft_seconds", "receipt to first backend output", {{"model", model_id_}}).observe(ttft_->count() / 1000.0);
        ResponseBuilder::Usage u;
        if (builder_) u = builder_->usage_totals();
        reg.counter("pulse_input_tokens_total", "prompt tokens reported by backends", {{"model", model_id_}}).add(static_cast<uint64_t>(u.input));
        reg.counter("pulse_cached_tokens_total", "prompt tokens served from the backend prefix cache", {{"model", model_id_}})
            .add(static_cast<uint64_t>(u.cached));
        reg.counter("pulse_output_tokens_total", "output tokens reported by backends", {{"model", model_id_}}).add(static_cast<uint64_t>(u.output));
        log::info("responses", id_ + " model=" + model_id_ + " endpoint=" + ep + " outcome=" + outcome_ + " in=" + std::to_string(u.input) +
                                   " cached=" + std::to_string(u.cached) + " out=" + std::to_string(u.output) +
                                   " ttft_ms=" + (ttft_ ? std::to_string(ttft_->count()) : "-") +
                                   " total_ms=" + std::to_string(duration_cast<milliseconds>(steady_clock::now() - t0_).count()));
        // The end of a response written past POCO (its last events and last chunk, one send)
        // goes out only now, after the trace, metrics and log above, as POCO's would: a client
        // that saw the end sees its accounting.
        if (raw_ && head_sent_) {
            tail_ += "0\r\n\r\n";
            write_raw(tail_);
        }
    }

private:
    Gateway& gw_;
    Poco::Net::HTTPServerRequest& req_;
    Poco::Net::HTTPServerResponse& resp_;
    std::shared_ptr<const Snapshot> snap_;  // the config generation this request uses, to its end
    const config::Config& cfg_;
    const std::string id_;
    const steady_clock::time_point t0_ = steady_clock::now();

    rapidjson::Document doc_;
    std::string model_id_, cache_key_;
    const ModelRuntime* rt_ = nullptr;
    bool streaming_ = false;

    const pulse_translation_vt_t* vt_ = nullptr;
    std::atomic<bool> cancelled_{false};
    pulse_call call_;
    pulse_upstream_req upreq_;
    std::string upstream_body_;
    void* stream_ = nullptr;
    std::unique_ptr<ResponseBuilder> builder_;

    Poco::Net::StreamSocket* socket_ = nullptr;
    std::ostream* out_ = nullptr;
    bool lost_ = false;
    milliseconds keepalive_{10000};
    steady_clock::time_point last_event_ = steady_clock::now();
    steady_clock::time_point last_gone_check_ = steady_clock::now();
    bool unflushed_ = false;
    bool accepted_ = false, fed_ = false;  // of the current attempt

    // While the stream loop relays (relay()): events go to relay_out_ instead of POCO's stream.
    // raw_: this response's HTTP head, chunks and terminator are written by us, not by POCO.
    bool relay_ = false, raw_ = false, head_sent_ = false;
    std::string relay_out_;
    std::string tail_;  // framed bytes held back to leave with the last chunk
    const EndpointRef* relay_ep_ = nullptr;
    std::optional<Attempt> relay_result_;

    pulse_status_t last_status_ = PULSE_E_UNAVAILABLE;
    std::string last_error_ = "no endpoint configured";
    std::string served_by_, outcome_;
    std::optional<milliseconds> ttft_;
};

void Gateway::responses(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp) {
    struct Active {
        std::atomic<int>& n;
        metrics::Gauge& g = metrics::global().gauge("pulse_active_requests", "Responses requests in flight");
        explicit Active(std::atomic<int>& a) : n(a) {
            n.fetch_add(1);
            g.add(1);
        }
        ~Active() {
            n.fetch_sub(1);
            g.add(-1);
        }
    } active(active_);
    auto snap = snapshot();
    if (draining_) return discard_body(req, resp), send_error(resp, 503, "server_error", "the gateway is shutting down", {}, "draining", 1);
    if (active_.load() > snap->cfg.server.max_streams) {
        // The worker pool keeps spare threads so an over-capacity request still gets a clear
        // answer instead of a silently closed socket.
        metrics::global().counter("pulse_capacity_rejections_total", "requests refused because max_streams were in flight").add();
        discard_body(req, resp);
        return send_error(resp, 503, "server_error",
                          "the gateway is at capacity (" + std::to_string(snap->cfg.server.max_streams) +
                              " requests in flight, server.max_streams); retry shortly",
                          {}, "at_capacity", 1);
    }
    ResponseSession(*this, req, resp).run();
}

}  // namespace pulse::gateway
