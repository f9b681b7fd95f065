// POST /v1/responses: validate, translate, send to the first endpoint that takes the request,
// stream the translated events back (or aggregate them for stream:false).
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerRequestImpl.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/StreamSocket.h>

#include <chrono>
#include <istream>
#include <random>

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

// The client closed its end: the socket polls readable and has nothing to read.
bool client_gone(Poco::Net::StreamSocket& s) {
    try {
        return s.poll(Poco::Timespan(0), Poco::Net::Socket::SELECT_READ) && s.available() == 0;
    } catch (...) {
        return true;
    }
}

// Calls stream_close exactly once, whatever path the request takes.
struct ProfileStream {
    const pulse_translation_vt_t& vt;
    void* stream = nullptr;
    ~ProfileStream() {
        if (stream) vt.stream_close(stream);
    }
};

}  // namespace

namespace {
struct ActiveRequest {
    metrics::Gauge& g = metrics::global().gauge("pulse_active_requests", "Responses requests in flight");
    ActiveRequest() { g.add(1); }
    ~ActiveRequest() { g.add(-1); }
};
}  // namespace

void Gateway::responses(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp) {
    auto t0 = steady_clock::now();
    ActiveRequest active;
    const std::string id = new_response_id();

    // ---- body: bounded, then parsed and validated before anything else happens ----
    const int64_t limit = cfg_.server.max_body_bytes;
    auto too_large = [&](const std::string& size) {
        // Read (and drop) what the client is still sending, up to a bound, so it sees the 413
        // instead of a reset connection; then close.
        std::istream& in = req.stream();
        char sink[65536];
        int64_t drained = 0;
        while (drained < 64 * 1024 * 1024 && in.read(sink, sizeof sink).gcount() > 0) drained += in.gcount();
        resp.setKeepAlive(false);
        send_error(resp, 413, "invalid_request_error",
                   "request body " + size + "is over the limit of " + std::to_string(limit) + " bytes (server.max_body_bytes)",
                   {}, "request_too_large");
    };
    if (req.hasContentLength() && req.getContentLength64() > limit)
        return too_large("of " + std::to_string(req.getContentLength64()) + " bytes ");
    std::string body;
    {
        std::istream& in = req.stream();
        char buf[65536];
        while (in.read(buf, sizeof buf) || in.gcount() > 0) {
            body.append(buf, static_cast<size_t>(in.gcount()));
            if (static_cast<int64_t>(body.size()) > limit) return too_large("");
        }
    }
    rapidjson::Document doc;
    auto invalid = [&](const RequestError& e) {
        metrics::global().counter("pulse_invalid_requests_total", "requests refused with a 4xx before translation", {{"code", e.code}}).add();
        send_error(resp, e.http_status, "invalid_request_error", e.message, e.param, e.code);
    };
    if (auto e = parse_body(body, doc)) return invalid(*e);
    if (auto e = validate_request(doc)) return invalid(*e);

    std::string model_id = doc["model"].GetString();
    const ModelRuntime* rt = runtime(model_id);
    if (!rt) {
        std::string known;
        for (const auto& r : runtimes_) known += (known.empty() ? "" : ", ") + r->cfg->id;
        return send_error(resp, 400, "invalid_request_error",
                          "model '" + model_id + "' is not configured here (models: " + (known.empty() ? "none" : known) + ")",
                          "model", "model_not_found");
    }
    bool streaming = doc.HasMember("stream") && doc["stream"].IsTrue();
    if (draining_) return send_error(resp, 503, "server_error", "the gateway is shutting down", {}, "draining", 1);

    // ---- translate the request ----
    const auto& vt = rt->profile->registration.translation;
    const std::string& plugin_id = rt->profile->plugin_id();
    std::atomic<bool> cancelled{false};
    pulse_call call;
    call.request_id = id;
    call.cancelled = &cancelled;
    pulse_upstream_req upreq;
    pulse_status_t rc = vt.build_request(rt->instance, &call, host::view(&doc), host::view(&rt->view), &upreq);
    if (rc == PULSE_OK && !upreq.body.complete()) {
        rc = PULSE_E_INTERNAL;
        call.message = "profile '" + rt->profile->registration.name + "' wrote an incomplete upstream request";
        call.has_message = true;
    }
    if (rc != PULSE_OK) {
        auto h = http_error_for(rc);
        std::string msg = host::call_error(call, rc, plugin_id);
        if (h.status >= 500) log::error("responses", id + ": " + msg);
        return send_error(resp, h.status, h.type, msg, {}, h.code, h.retry_after);
    }
    std::string upstream_body(upreq.body.text());
    ProfileStream pstream{vt};
    call.clear_error();
    if ((rc = vt.stream_open(rt->instance, &call, host::view(&doc), &pstream.stream)) != PULSE_OK) {
        auto h = http_error_for(rc);
        return send_error(resp, h.status, h.type, host::call_error(call, rc, plugin_id), {}, h.code, h.retry_after);
    }

    // ---- output: SSE to the client, or collected for stream:false ----
    Poco::Net::StreamSocket& socket = static_cast<Poco::Net::HTTPServerRequestImpl&>(req).socket();
    socket.setSendTimeout(Poco::Timespan(static_cast<Poco::Timespan::TimeDiff>(cfg_.server.send_timeout_s * 1e6)));
    std::ostream* out = nullptr;
    bool lost = false;  // the client went away
    auto open_sse = [&] {
        if (out || !streaming) return;
        resp.setStatus(Poco::Net::HTTPResponse::HTTP_OK);
        resp.setContentType("text/event-stream");
        resp.set("Cache-Control", "no-cache");
        resp.set("X-Accel-Buffering", "no");
        resp.setChunkedTransferEncoding(true);
        out = &resp.send();
        out->flush();
    };
    ResponseBuilder builder(id, model_id, rt->reasoning, [&](std::string_view type, const std::string& json) {
        if (!streaming || lost) return;
        open_sse();
        std::string ev = sse_event(type, json);
        out->write(ev.data(), static_cast<std::streamsize>(ev.size()));
        out->flush();
        if (!out->good()) lost = true;
    });
    const milliseconds keepalive(static_cast<int64_t>(cfg_.upstream.keepalive_s * 1000));
    auto since_event = steady_clock::now();
    auto& keepalives = metrics::global().counter("pulse_keepalives_total", "response.in_progress keepalive events sent",
                                                 {{"model", model_id}});
    auto keepalive_if_due = [&] {
        if (!streaming || steady_clock::now() - since_event < keepalive) return;
        builder.keepalive();
        keepalives.add();
        since_event = steady_clock::now();
    };

    // ---- endpoints in failover order: move on only while nothing has been sent ----
    pulse_status_t last_status = PULSE_E_UNAVAILABLE;
    std::string last_error = "no endpoint configured";
    std::string served_by;
    std::optional<milliseconds> ttft;
    std::string outcome;
    for (size_t i = 0; i < rt->cfg->endpoints.size() && outcome.empty() && !lost; ++i) {
        const auto& ep = rt->cfg->endpoints[i];
        std::unique_ptr<UpstreamStream> up =
            ep.is_plugin() ? rt->backends[i]->open(upstream_body, id) : open_http(ep, upreq, cfg_.upstream);
        bool accepted = false, fed = false;
        while (!lost && outcome.empty()) {
            UpEvent e = up->next(keepalive);
            if (client_gone(socket)) lost = true;
            if (lost) break;
            switch (e.kind) {
                case UpEvent::Kind::timeout:
                    keepalive_if_due();
                    continue;

                case UpEvent::Kind::accepted:
                    accepted = true;
                    served_by = ep.name;
                    builder.start();
                    since_event = steady_clock::now();
                    continue;
                case UpEvent::Kind::rejected: {
                    pulse_status_t s = e.status;
                    call.clear_error();
                    if (e.http_status) {
                        s = vt.map_error ? vt.map_error(rt->instance, &call, e.http_status, pulse_str_t{e.text.data(), e.text.size()})
                                         : (e.http_status >= 500 || e.http_status == 429 ? PULSE_E_UNAVAILABLE : PULSE_E_INVALID_ARGUMENT);
                        last_error = call.has_message ? call.message
                                                      : "backend answered HTTP " + std::to_string(e.http_status) + ": " + e.text.substr(0, 300);
                    } else {
                        last_error = e.text;
                    }
                    last_status = s;
                    log::warn("responses", id + ": endpoint " + ep.name + " refused the request: " + last_error);
                    if (!retryable(s)) outcome = "rejected";
                    break;
                }
                case UpEvent::Kind::failed:
                    last_status = e.status ? e.status : PULSE_E_UNAVAILABLE;
                    last_error = e.text;
                    if (!accepted || e.before_accept || !fed) {
                        log::warn("responses", id + ": endpoint " + ep.name + " failed: " + e.text);
                        break;  // no output came from this endpoint: the next one may serve it
                    }
                    call.clear_error();
                    vt.stream_finish(pstream.stream, &call, PULSE_STREAM_TRUNCATED, &builder);
                    outcome = builder.end(PULSE_STREAM_TRUNCATED, e.text);
                    break;
                case UpEvent::Kind::data: {
                    if (!ttft) ttft = duration_cast<milliseconds>(steady_clock::now() - t0);
                    fed = true;
                    call.clear_error();
                    pulse_status_t s = vt.stream_feed(pstream.stream, &call, {e.text.data(), e.text.size()}, &builder);
                    if (s < 0) {
                        builder.fail(s, host::call_error(call, s, plugin_id));
                        outcome = "failed";
                    }
                    since_event = steady_clock::now();
                    keepalive_if_due();
                    continue;
                }
                case UpEvent::Kind::done: {
                    call.clear_error();
                    pulse_status_t s = vt.stream_finish(pstream.stream, &call, PULSE_STREAM_CLEAN, &builder);
                    if (s < 0) builder.fail(s, host::call_error(call, s, plugin_id));
                    outcome = builder.ended() ? (builder.failure() ? "failed" : "completed") : builder.end(PULSE_STREAM_CLEAN);
                    break;
                }
            }
            if (e.kind == UpEvent::Kind::rejected || e.kind == UpEvent::Kind::failed) break;
        }
        if (outcome.empty() && !lost && i + 1 < rt->cfg->endpoints.size())
            metrics::global().counter("pulse_failovers_total", "requests moved to the next endpoint before any output",
                                      {{"model", model_id}, {"from", ep.name}}).add();
        if (lost) {
            up->cancel();
            call.clear_error();
            vt.stream_finish(pstream.stream, &call, PULSE_STREAM_CANCELLED, &builder);
            outcome = "cancelled";
        }
    }

    if (outcome.empty() || outcome == "rejected") {
        // No endpoint produced a response.
        auto h = http_error_for(last_status);
        if (outcome.empty()) last_error = "no backend could take the request; last error: " + last_error;
        if (builder.started()) {
            builder.fail(last_status, last_error);
        } else if (!lost) {
            send_error(resp, h.status, h.type, last_error, {}, h.code, h.retry_after);
        }
        outcome = outcome.empty() ? "unavailable" : "rejected";
    } else if (!streaming && !lost) {
        if (auto f = builder.failure(); f && !builder.has_output()) {
            auto h = http_error_for(f->first);
            send_error(resp, h.status, h.type, f->second, {}, f->first == PULSE_E_CONTEXT_LENGTH ? "context_length_exceeded" : h.code,
                       h.retry_after);
        } else {
            send_json(resp, 200, builder.final_response());
        }
    }

    const auto& u = builder.usage_totals();
    auto& reg = metrics::global();
    const std::string ep_label = served_by.empty() ? "-" : served_by;
    reg.counter("pulse_requests_total", "Responses requests by model, endpoint and outcome",
                {{"model", model_id}, {"endpoint", ep_label}, {"outcome", outcome}}).add();
    double total_s = duration<double>(steady_clock::now() - t0).count();
    reg.histogram("pulse_request_duration_seconds", "whole request, receipt to last byte", {{"model", model_id}}).observe(total_s);
    if (ttft) reg.histogram("pulse_ttft_seconds", "receipt to first backend output", {{"model", model_id}}).observe(ttft->count() / 1000.0);
    reg.counter("pulse_input_tokens_total", "prompt tokens reported by backends", {{"model", model_id}}).add(static_cast<uint64_t>(u.input));
    reg.counter("pulse_cached_tokens_total", "prompt tokens served from the backend prefix cache", {{"model", model_id}})
        .add(static_cast<uint64_t>(u.cached));
    reg.counter("pulse_output_tokens_total", "output tokens reported by backends", {{"model", model_id}}).add(static_cast<uint64_t>(u.output));
    log::info("responses", id + " model=" + model_id + " endpoint=" + (served_by.empty() ? "-" : served_by) + " outcome=" +
                               outcome + " in=" + std::to_string(u.input) + " cached=" + std::to_string(u.cached) +
                               " out=" + std::to_string(u.output) + " ttft_ms=" + (ttft ? std::to_string(ttft->count()) : "-") +
                               " total_ms=" + std::to_string(duration_cast<milliseconds>(steady_clock::now() - t0).count()));
}

}  // namespace pulse::gateway
