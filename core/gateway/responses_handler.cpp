// POST /v1/responses: validate, translate, send to the first endpoint that takes the request
// (retrying across endpoints with backoff inside the retry window while nothing has been
// sent), stream the translated events back (or aggregate them for stream:false).
//
// The pieces, in the order a request meets them:
//   ClientWriter     the one way bytes reach the client (SSE framed for its HTTP version)
//   ResponseSession  read_and_validate -> translate -> serve (the failover loop) -> finish
//     attempt()      one endpoint: an HTTP response relayed by the stream loop, or a backend
//                    plugin's stream followed on this thread
//     on_event()     what each upstream event does to the response (both paths)
//     finish()       the answer's end, the one place the last bytes are written
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"
#include "gateway/gateway.h"
#include "gateway/http_util.h"
#include "gateway/responses_api.h"

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

// How a status reaches an HTTP client that has not seen any event yet (docs/SDK.md, "Status
// codes"). Never 500: Codex hides a 500's message behind "high demand". A plugin's own failure
// (INTERNAL, ABI, CANCELLED while the client is still there) is a 502 that says what failed,
// with no Retry-After: asking again gives the same answer.
HttpError http_error_for(pulse_status_t s) {
    switch (s) {
        case PULSE_E_INVALID_ARGUMENT:
        case PULSE_E_UNSUPPORTED: return {400, "invalid_request_error", "invalid_request", 0};
        case PULSE_E_CONTEXT_LENGTH: return {400, "invalid_request_error", "context_length_exceeded", 0};
        case PULSE_E_UNAVAILABLE:
        case PULSE_E_RESOURCE_EXHAUSTED: return {503, "server_error", "backend_unavailable", 1};
        case PULSE_E_DEADLINE: return {504, "server_error", "timeout", 1};
        case PULSE_E_INTERNAL:
        case PULSE_E_ABI:
        case PULSE_E_CANCELLED: return {502, "server_error", "plugin_error", 0};
        default: return {502, "server_error", "bad_gateway", 1};
    }
}

// Only these are worth another endpoint or another round: the rest give the same answer again.
bool retryable(pulse_status_t s) { return s == PULSE_E_UNAVAILABLE || s == PULSE_E_RESOURCE_EXHAUSTED; }

enum class Outcome { none, completed, incomplete, failed, unavailable, rejected, invalid, cancelled, client_lost };

const char* name(Outcome o) {
    switch (o) {
        case Outcome::none: return "error";
        case Outcome::completed: return "completed";
        case Outcome::incomplete: return "incomplete";
        case Outcome::failed: return "failed";
        case Outcome::unavailable: return "unavailable";
        case Outcome::rejected: return "rejected";
        case Outcome::invalid: return "invalid";
        case Outcome::cancelled: return "cancelled";
        case Outcome::client_lost: return "client_lost";
    }
    return "error";
}

Outcome outcome_of(std::string_view terminal) {
    return terminal == "completed" ? Outcome::completed : terminal == "incomplete" ? Outcome::incomplete : Outcome::failed;
}

// Appends one JSON line to the trace file. The file holds whole prompts: it is opened without
// following a symbolic link and without blocking (a FIFO there would otherwise hold every
// request, and shutdown, until a reader came), written only if it is a regular file with no
// other name (a hard link would put prompts where its other name points), and made 0600
// whatever mode it had; if that cannot be done, nothing is written and the reason is logged
// (once a minute).
void trace(const std::string& file, const std::string& id, const char* what, std::string_view json) {
    static std::mutex m;
    static steady_clock::time_point last_complaint{};
    std::lock_guard lock(m);
    auto complain = [&](const std::string& why) {
        if (steady_clock::now() - last_complaint < minutes(1)) return;
        last_complaint = steady_clock::now();
        log::error("trace", "not writing the trace file " + file + ": " + why);
    };
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0600);
    if (fd < 0)
        return complain(errno == ELOOP ? "it is a symbolic link" : errno == ENXIO ? "it is not a regular file (a FIFO or socket)" : std::strerror(errno));
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return complain("it is not a regular file");
    }
    if (st.st_nlink != 1) {
        ::close(fd);
        return complain("it has another name (a hard link)");
    }
    if ((st.st_mode & 07777) != 0600 && ::fchmod(fd, 0600) != 0) {
        ::close(fd);
        return complain(std::string("cannot make it mode 0600: ") + std::strerror(errno));
    }
    std::string line = "{\"id\":\"" + id + "\",\"what\":\"" + what + "\",\"body\":" + (json.empty() ? std::string("null") : std::string(json)) + "}\n";
    ssize_t n = ::write(fd, line.data(), line.size());
    (void)n;
    ::close(fd);
}

// Everything a streamed response sends goes through here: SSE events, framed for the client's
// HTTP version, preceded by the head. The bytes leave from the request's thread (flush()) or
// from the stream loop (take(), while it relays).
class ClientWriter {
public:
    explicit ClientWriter(server::Exchange& ex) : ex_(ex) {}

    void event(std::string_view type, std::string_view json) {
        events_ += "event: ";
        events_ += type;
        events_ += "\ndata: ";
        events_ += json;
        events_ += "\n\n";
    }
    // The framed bytes produced since the last take, the head first.
    void take(std::string& wire) {
        if (events_.empty()) return;
        if (!head_sent_) {
            head_sent_ = true;
            server::Headers h = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
            h.insert(h.end(), extra_.begin(), extra_.end());
            ex_.stream_head(wire, "text/event-stream", h);
        }
        ex_.frame(wire, events_);
        events_.clear();
    }
    // A header for the head, if the head has not gone out yet (false when it has).
    bool add_header(std::string name, std::string value) {
        if (head_sent_) return false;
        std::erase_if(extra_, [&](const auto& h) { return h.first == name; });  // the latest value wins
        extra_.emplace_back(std::move(name), std::move(value));
        return true;
    }
    // Bytes the stream loop could not send before its job ended: they go first.
    void put_back(std::string unsent) { wire_.insert(0, unsent); }
    // Sends what is queued (blocking, bounded by the send timeout). False once the client is lost.
    bool flush() {
        take(wire_);
        if (!wire_.empty() && !ex_.lost()) ex_.write(wire_);
        wire_.clear();
        return !ex_.lost();
    }
    // The end of the body (the last chunk); false when the client did not take it.
    bool end() {
        if (!head_sent_) return !ex_.lost();
        ex_.stream_end(wire_);
        return flush();
    }

private:
    server::Exchange& ex_;
    std::string events_;  // SSE text not yet framed
    std::string wire_;    // framed bytes not yet sent
    server::Headers extra_;
    bool head_sent_ = false;
};

}  // namespace

// One /v1/responses request from receipt to the last byte.
class ResponseSession : public RelayJob {
public:
    ResponseSession(Gateway& gw, server::Exchange& ex)
        : gw_(gw), ex_(ex), snap_(gw.snapshot()), cfg_(snap_->cfg), id_(new_response_id()), writer_(ex) {}

    ~ResponseSession() override {
        if (stream_) vt_->stream_close(stream_);
    }

    void run() {
        if (read_and_validate() && (apply_policy(), translate())) {
            report_budget();
            serve();
        }
        finish();
    }

private:
    // again: the same endpoint once more on a fresh connection (a pooled one had gone stale).
    // resend: the same endpoint once more with a rebuilt request (it refused the reasoning budget).
    enum class Attempt { served, retry, final, again, resend };

    bool read_and_validate() {
        if (auto e = parse_body_in_place(ex_.body(), doc_)) return invalid(*e);
        // Traced once it is known to be JSON, so every trace line stays valid JSON.
        if (!cfg_.server.trace_file.empty()) {
            rapidjson::StringBuffer compact;  // one line, whatever whitespace the client sent
            rapidjson::Writer<rapidjson::StringBuffer> w(compact);
            doc_.Accept(w);
            trace(cfg_.server.trace_file, id_, "request", {compact.GetString(), compact.GetSize()});
        }
        if (auto e = validate_request(doc_)) return invalid(*e);
        model_id_ = doc_["model"].GetString();
        rt_ = snap_->find(model_id_);
        if (!rt_) {
            std::string known;
            for (const auto& r : snap_->models) known += (known.empty() ? "" : ", ") + r->cfg->id;
            return invalid({400, "model '" + model_id_ + "' is not configured here (models: " + (known.empty() ? "none" : known) + ")", "model",
                            "model_not_found"});
        }
        streaming_ = doc_.HasMember("stream") && doc_["stream"].IsTrue();
        conversation_ = conversation_key(doc_);
        entry_ = gw_.board_.begin(id_, model_id_, streaming_);
        return true;
    }

    // The model's policy (if any) decides the request's reasoning budget, effort and sampling:
    // what it says is written into the request before translation. It never fails the request.
    void apply_policy() {
        const Policy* pol = rt_->policy.get();
        if (!pol) return;
        rapidjson::StringBuffer b;
        {
            rapidjson::Writer<rapidjson::StringBuffer> w(b);
            auto kv = [&](const char* k, std::string_view v) {
                w.Key(k);
                w.String(v.data(), static_cast<rapidjson::SizeType>(v.size()));
            };
            w.StartObject();
            kv("model", model_id_);
            std::string effort;
            if (doc_.HasMember("reasoning") && doc_["reasoning"].IsObject() && doc_["reasoning"].HasMember("effort") &&
                doc_["reasoning"]["effort"].IsString())
                effort = doc_["reasoning"]["effort"].GetString();
            kv("effort", effort);
            w.Key("tools");
            w.StartArray();
            if (doc_.HasMember("tools") && doc_["tools"].IsArray())
                for (const auto& t : doc_["tools"].GetArray())
                    if (t.IsObject() && t.HasMember("name") && t["name"].IsString()) w.String(t["name"].GetString());
            w.EndArray();
            w.Key("history_items");
            w.Uint64(doc_.HasMember("input") && doc_["input"].IsArray() ? doc_["input"].Size() : 1);
            kv("conversation", conversation_);
            w.Key("input_chars");
            w.Uint64(ex_.body().size());
            w.Key("stream");
            w.Bool(streaming_);
            w.EndObject();
        }
        Policy::Decision d;
        std::string why;
        const auto outcome = pol->decide({b.GetString(), b.GetSize()}, id_, d, why);
        metrics::global()
            .counter(metrics::kPolicyDecisions.name, metrics::kPolicyDecisions.help,
                     {{"model", model_id_}, {"policy", pol->component()}, {"outcome", Policy::name(outcome)}})
            .add();
        if (outcome != Policy::Outcome::applied) {
            if (outcome != Policy::Outcome::unchanged)
                log::warn("policy", id_ + ": policy '" + pol->component() + "' " + Policy::name(outcome) + ": " + why +
                                        "; the request goes on unchanged");
            return;
        }
        auto& a = doc_.GetAllocator();
        if (!doc_.HasMember("reasoning") || !doc_["reasoning"].IsObject()) {
            doc_.RemoveMember("reasoning");
            doc_.AddMember("reasoning", rapidjson::Value(rapidjson::kObjectType), a);
        }
        auto& r = doc_["reasoning"];
        auto set = [&](rapidjson::Value& obj, const char* k, rapidjson::Value v) {
            if (obj.HasMember(k)) obj[k] = v;
            else obj.AddMember(rapidjson::StringRef(k), v, a);
        };
        std::string said;
        if (d.effort) {
            set(r, "effort", rapidjson::Value(d.effort->c_str(), static_cast<rapidjson::SizeType>(d.effort->size()), a));
            said += " effort=" + *d.effort;
        }
        if (d.reasoning_budget) {
            set(r, "budget_tokens", rapidjson::Value(*d.reasoning_budget));
            said += " reasoning_budget=" + std::to_string(*d.reasoning_budget);
        }
        for (const auto& [k, v] : d.sampling) {
            const bool integer = k == "top_k" || k == "max_output_tokens";
            // Keys are the decision's (validated against a fixed list); values are ours to copy.
            rapidjson::Value key(k.c_str(), static_cast<rapidjson::SizeType>(k.size()), a);
            rapidjson::Value val = integer ? rapidjson::Value(static_cast<int64_t>(v)) : rapidjson::Value(v);
            if (doc_.HasMember(key)) doc_[key] = val;
            else doc_.AddMember(key, val, a);
            char num[32];
            std::snprintf(num, sizeof num, "%g", v);
            said += " " + k + "=" + num;
        }
        log::info("policy", id_ + ": policy '" + pol->component() + "' decided" + said);
    }

    // A reasoning budget (from the policy, or the client's reasoning.budget_tokens) is reported
    // as the profile applied it: enforced by the backend, or not (a header and a log line).
    void report_budget() {
        if (!doc_.HasMember("reasoning") || !doc_["reasoning"].IsObject() || !doc_["reasoning"].HasMember("budget_tokens") ||
            !doc_["reasoning"]["budget_tokens"].IsInt64())
            return;
        budget_ = doc_["reasoning"]["budget_tokens"].GetInt64();
        auto it = upreq_.notes.find("reasoning_budget");
        std::string how = it != upreq_.notes.end() ? it->second
                                                   : "not enforced: profile '" + rt_->profile->registration.name + "' does not apply reasoning budgets";
        // The profile wrote the budget into a field; an in-process backend says itself whether it
        // reads that field (an HTTP backend refuses a field it cannot apply: see resend).
        if (auto f = upreq_.notes.find("reasoning_budget_field"); f != upreq_.notes.end()) {
            std::string ignoring;
            size_t plugins = 0;
            for (const auto& ep : rt_->endpoints) {
                if (!ep.backend) continue;
                ++plugins;
                if (!ep.backend->enforces(f->second)) ignoring += (ignoring.empty() ? "'" : ", '") + ep.backend->name() + "'";
            }
            if (!ignoring.empty() && plugins == rt_->endpoints.size())
                how = "not enforced: backend " + ignoring + " does not enforce " + f->second;
            else if (!ignoring.empty())
                how += "; not by backend " + ignoring + ", which does not enforce " + f->second;
        }
        budget_enforced_ = how.rfind("enforced", 0) == 0;
        budget_header_ = std::to_string(*budget_) + "; " + how;
        if (streaming_) writer_.add_header("X-Pulse-Reasoning-Budget", budget_header_);
        metrics::global()
            .counter("pulse_reasoning_budget_requests_total", "requests with a reasoning budget, by whether the backend enforces it",
                     {{"model", model_id_}, {"enforced", budget_enforced_ ? "yes" : "no"}})
            .add();
        if (!budget_enforced_) log::warn("policy", id_ + ": reasoning budget " + std::to_string(*budget_) + " " + how);
    }

    // A backend that refuses the request because of its reasoning budget field (vLLM without a
    // reasoning config, or on a model runner without budgets, answers 400 naming the field): the
    // request is sent again without the budget, reported as not enforced. A policy never costs
    // the request.
    bool drop_refused_budget(const EndpointRef& ep, const std::string& body) {
        auto it = upreq_.notes.find("reasoning_budget");
        if (it == upreq_.notes.end() || it->second.rfind("enforced by ", 0) != 0) return false;
        std::string field = it->second.substr(12);
        field = field.substr(0, field.find(' '));
        if (field.empty() || body.find(field) == std::string::npos) return false;
        doc_["reasoning"].RemoveMember("budget_tokens");
        upreq_.reset();
        call_.reset();
        upreq_.body.call = &call_;
        pulse_status_t rc = vt_->build_request(rt_->instance, &call_, host::view(&doc_), host::view(&rt_->view), &upreq_);
        upreq_.body.call = nullptr;
        if (rc != PULSE_OK || !upreq_.body.complete() || open_profile_stream() != PULSE_OK) return false;
        const std::string why = "not enforced: endpoint " + ep.cfg->name + " refused " + field + " (" + body.substr(0, 160) + ")";
        log::warn("policy", id_ + ": reasoning budget " + std::to_string(*budget_) + " " + why + "; sent again without it");
        budget_header_ = std::to_string(*budget_) + "; " + why;
        metrics::global()
            .counter("pulse_reasoning_budget_refused_total", "requests sent again without their reasoning budget because the backend refused it",
                     {{"model", model_id_}, {"endpoint", ep.cfg->name}})
            .add();
        budget_enforced_ = false;
        if (streaming_) writer_.add_header("X-Pulse-Reasoning-Budget", budget_header_);
        return true;
    }

    bool invalid(const RequestError& e) {
        ex_.close_after();  // a client that sent garbage gets no second chance on this connection
        metrics::global().counter("pulse_invalid_requests_total", "requests refused with a 4xx before translation", {{"code", e.code}}).add();
        send_error(ex_, e.http_status, "invalid_request_error", e.message, e.param, e.code);
        outcome_ = Outcome::invalid;
        return false;
    }

    bool translate() {
        vt_ = &rt_->profile->registration.translation;
        call_.request_id = id_;
        call_.cancelled = &cancelled_;
        // The upstream request is about the size of the client's body: one buffer of that size up
        // front, rather than growing by half again each time it fills (a large body then peaked
        // at its own size plus two copies of the upstream request while one was moved).
        upreq_.body.buffer.Reserve(ex_.body().size() + 4096);
        if (!ask_prepare() || (!prep_req_ && !build_upstream())) return false;
        builder_ = std::make_unique<ResponseBuilder>(id_, model_id_, rt_->reasoning, [this](std::string_view type, std::string_view json) {
            if (!streaming_) return;
            last_event_ = steady_clock::now();
            writer_.event(type, json);
        });
        keepalive_ = milliseconds(static_cast<int64_t>(cfg_.upstream.keepalive_s * 1000));
        return true;
    }

    // Fails the request as the profile said (`rc`, with call_'s message).
    bool refused_by_profile(pulse_status_t rc) {
        last_status_ = rc;
        last_error_ = host::call_error(call_, rc, rt_->profile->plugin_id());
        if (http_error_for(rc).status >= 500) log::error("responses", id_ + ": " + last_error_);
        outcome_ = Outcome::rejected;
        return false;
    }

    // SDK 1.3: the profile may need an answer from the backend before it can write the request
    // (llama-server's rendered prompt, for a token-exact resume). Then the request is built at
    // the first attempt on an HTTP endpoint, once that answer is in (prepare_on).
    bool ask_prepare() {
        if (!PULSE_HAS_FIELD(vt_, pulse_translation_vt_t, prepare) || !vt_->prepare) return true;
        auto req = std::make_unique<pulse_upstream_req>();
        call_.reset();
        req->body.call = &call_;
        pulse_status_t rc = vt_->prepare(rt_->instance, &call_, host::view(&doc_), host::view(&rt_->view), req.get());
        req->body.call = nullptr;
        if (rc == PULSE_OK && req->path_set && !req->body.complete()) {
            rc = PULSE_E_INTERNAL;
            call_.message = "profile '" + rt_->profile->registration.name + "' wrote an unusable preparatory request: " + req->body.incomplete_reason();
            call_.has_message = true;
        }
        if (rc != PULSE_OK) return refused_by_profile(rc);
        if (req->path_set) prep_req_ = std::move(req);
        return true;
    }

    // The upstream request (build_request) and the stream that reads its answer.
    bool build_upstream() {
        call_.reset();
        upreq_.body.call = &call_;
        pulse_status_t rc = vt_->build_request(rt_->instance, &call_, host::view(&doc_), host::view(&rt_->view), &upreq_);
        upreq_.body.call = nullptr;
        if (rc == PULSE_OK && !upreq_.body.complete()) {
            rc = PULSE_E_INTERNAL;
            call_.message = "profile '" + rt_->profile->registration.name + "' wrote an unusable upstream request: " + upreq_.body.incomplete_reason();
            call_.has_message = true;
        }
        if (rc == PULSE_OK) rc = open_profile_stream();
        if (rc != PULSE_OK) return refused_by_profile(rc);
        built_ = true;
        return true;
    }

    // Sends the profile's preparatory request to `ep` (once per response) and builds the request
    // with its answer; an in-process backend is not asked (the profile builds without one). A
    // value when the attempt is over: `ep` failed (another endpoint may serve), or the profile
    // refused to build the request.
    std::optional<Attempt> prepare_on(const EndpointRef& ep) {
        if (!ep.backend) {
            std::string answer;
            const int status = post_prepared(*ep.cfg, *prep_req_, cfg_.upstream, &answer);
            metrics::global()
                .counter("pulse_prepared_requests_total", "preparatory requests a profile asked for (SDK 1.3 prepare: a rendered prompt)",
                         {{"model", model_id_}, {"endpoint", ep.cfg->name}, {"outcome", status >= 200 && status <= 299 ? "ok" : "failed"}})
                .add();
            if (status < 200 || status > 299) {
                UpEvent e;
                e.kind = status ? UpEvent::Kind::rejected : UpEvent::Kind::failed;
                e.http_status = status;
                e.status = PULSE_E_UNAVAILABLE;
                e.text = status ? answer : "the preparatory request " + prep_req_->path + " failed: " + answer;
                return on_event(std::move(e), ep).value_or(Attempt::retry);
            }
            if (prepared_.Parse(answer.c_str(), answer.size()).HasParseError()) {
                prepared_.SetNull();
                return endpoint_failure(ep, PULSE_E_UNAVAILABLE, "the answer to the preparatory request " + prep_req_->path + " is not JSON");
            }
            upreq_.prepared = host::view(&prepared_);
        }
        if (!build_upstream()) return Attempt::final;
        return std::nullopt;
    }

    // A fresh profile stream for the next attempt: the request's own, or while resuming, one
    // that reads a continuation of what the client has (with the request that asks for it).
    // On failure the current stream (and request) stay as they were.
    pulse_status_t open_profile_stream() {
        void* fresh = nullptr;
        call_.reset();
        pulse_status_t rc = resuming_ ? open_resume_stream(&fresh) : vt_->stream_open(rt_->instance, &call_, host::view(&doc_), &fresh);
        if (rc != PULSE_OK) return rc;
        if (stream_) vt_->stream_close(stream_);
        stream_ = fresh;
        if (!resuming_ && builder_) builder_->restart_trail();
        return rc;
    }

    pulse_status_t open_resume_stream(void** fresh) {
        auto point = builder_->resume_point();
        if (!point) {
            call_.message = "the response showed a tool call: it cannot be continued";
            call_.has_message = true;
            return PULSE_E_UNSUPPORTED;
        }
        resumed_from_ = {point->text.size(), point->reasoning.size()};
        rapidjson::Document partial(rapidjson::kObjectType);
        auto& a = partial.GetAllocator();
        partial.AddMember("text", rapidjson::Value(point->text.c_str(), static_cast<rapidjson::SizeType>(point->text.size()), a), a);
        partial.AddMember("reasoning",
                          rapidjson::Value(point->reasoning.c_str(), static_cast<rapidjson::SizeType>(point->reasoning.size()), a), a);
        // What the earlier attempts spent, so the continuation asks only for what is left of the
        // request's limits (max_output_tokens, a reasoning budget).
        const auto spent = builder_->spent();
        partial.AddMember("output_tokens", rapidjson::Value(spent.output), a);
        partial.AddMember("reasoning_tokens", rapidjson::Value(spent.reasoning), a);
        // The token record, so that the backend continues from the very tokens (not the text).
        resumed_by_ = point->trail ? "by tokens" : "by text (" + (point->no_trail.empty() ? "the backend reports no token ids" : point->no_trail) + ")";
        if (point->trail) {
            rapidjson::Value ids(rapidjson::kArrayType), trail(rapidjson::kObjectType);
            ids.Reserve(static_cast<rapidjson::SizeType>(point->trail->first.size()), a);
            for (int32_t id : point->trail->first) ids.PushBack(id, a);
            trail.AddMember("tokens", ids, a);
            trail.AddMember("raw", rapidjson::Value(point->trail->second.c_str(), static_cast<rapidjson::SizeType>(point->trail->second.size()), a), a);
            partial.AddMember("trail", trail, a);
        }
        auto req = std::make_unique<pulse_upstream_req>();
        req->prepared = upreq_.prepared;
        req->body.call = &call_;
        pulse_status_t rc = vt_->resume(rt_->instance, &call_, host::view(&doc_), host::view(&rt_->view), host::view(&partial), req.get(), fresh);
        req->body.call = nullptr;
        if (rc == PULSE_OK && !req->body.complete()) {
            rc = PULSE_E_INTERNAL;
            call_.message = "profile '" + rt_->profile->registration.name + "' wrote an unusable resume request: " + req->body.incomplete_reason();
            call_.has_message = true;
        }
        if (rc != PULSE_OK) {
            if (*fresh) vt_->stream_close(*fresh);
            *fresh = nullptr;
            return rc;
        }
        // The profile says how it continued (it may go by text even with a record).
        if (auto n = req->notes.find("resume"); n != req->notes.end()) resumed_by_ = n->second;
        if (resumed_by_.rfind("by text", 0) == 0) resumed_by_ += ": re-tokenized there, a greedy answer may differ after the seam";
        resume_req_ = std::move(req);
        return PULSE_OK;
    }

    // What goes upstream now: the request, or the request to continue it.
    const pulse_upstream_req& active_request() const { return resuming_ ? *resume_req_ : upreq_; }
    std::string_view upstream_body() const { return active_request().body.text(); }

    // Mid-stream resume: endpoint `ep` failed (`why`) after this response's output began. When
    // the model allows it and the profile can, the response continues on the next endpoint the
    // failover loop tries (Attempt::retry), from exactly what the client has; otherwise nullopt
    // and the caller ends the response as failed, as it would have without resume.
    std::optional<Attempt> resume_elsewhere(const EndpointRef& ep, const std::string& why) {
        // Bounded like any failover: the loop in serve() ends its rounds with the retry window.
        if (!rt_->cfg->resume || !vt_->resume || gw_.cutting() || lost_ || !builder_->can_resume()) return std::nullopt;
        // The answer already has every token the client allowed: it ends as an uninterrupted one
        // cut at that limit would, not with a continuation that would go past it.
        if (auto limit = output_limit(); limit && builder_->spent().output >= *limit) {
            call_.reset();
            vt_->stream_finish(stream_, &call_, PULSE_STREAM_TRUNCATED, builder_.get());
            builder_->begin_resume();  // drops the attempt's failure; its tokens count in the usage
            builder_->finish(PULSE_FINISH_LENGTH);
            outcome_ = outcome_of(builder_->end(PULSE_STREAM_CLEAN));
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why + ") after the answer reached max_output_tokens (" +
                                       std::to_string(*limit) + "): it ends incomplete, as it would have there");
            return Attempt::served;
        }
        const bool was_resuming = resuming_;
        resuming_ = true;
        if (pulse_status_t rc = open_profile_stream(); rc != PULSE_OK) {
            resuming_ = was_resuming;
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why +
                                       "); the response cannot be resumed: " + host::call_error(call_, rc, rt_->profile->plugin_id()));
            return std::nullopt;
        }
        gw_.endpoint_failed(ep, why, /*real_request=*/true);
        builder_->begin_resume();
        ++resumes_;
        entry_->resumed();
        metrics::global()
            .counter(metrics::kResumed.name, metrics::kResumed.help,
                     {{"model", model_id_}, {"endpoint", ep.cfg->name}})
            .add();
        log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed mid-stream (" + why + "); resuming the response after " +
                                   std::to_string(resumed_from_.first) + " bytes of text and " + std::to_string(resumed_from_.second) +
                                   " of reasoning on the next endpoint, " + resumed_by_);
        return Attempt::retry;
    }

    // The request's max_output_tokens, or the model's configured default for it.
    std::optional<int64_t> output_limit() const {
        if (doc_.HasMember("max_output_tokens") && doc_["max_output_tokens"].IsInt64()) return doc_["max_output_tokens"].GetInt64();
        return rt_->cfg->sampling.max_output_tokens;
    }

    steady_clock::time_point window_end() const {
        return t0_ + duration_cast<steady_clock::duration>(duration<double>(cfg_.upstream.retry_window_s));
    }

    // Sends what is queued to the client, unless the stream loop is the one sending now.
    void flush() {
        if (relaying_ || lost_) return;
        if (!writer_.flush()) lost_ = true;
    }

    void keepalive_if_due() {
        if (!streaming_ || steady_clock::now() - last_event_ < keepalive_) return;
        builder_->keepalive();
        entry_->keepalive();
        flush();
        metrics::global().counter("pulse_keepalives_total", "response.in_progress keepalive events sent", {{"model", model_id_}}).add();
    }

    // The failure an attempt sees when the gateway cuts its streams at the drain deadline.
    UpEvent cut_event() const {
        UpEvent e;
        e.kind = UpEvent::Kind::failed;
        e.status = PULSE_E_UNAVAILABLE;
        e.text = "the gateway is shutting down (server.drain_timeout_s passed); retry the request";
        return e;
    }

    // Sends the request to endpoint `i` and follows it to the end, or to the point where
    // another endpoint should be tried. An HTTP endpoint's response is read by the stream loop
    // (relay()) once the request is sent; a backend plugin's stream is followed on this thread.
    Attempt attempt(size_t i) {
        const EndpointRef& ep = rt_->endpoints[i];
        InFlight in_flight(*ep.health);
        entry_->attempt(ep.cfg->name);
        fed_ = false;
        if (!built_)
            if (auto a = prepare_on(ep)) return *a;
        if (!ep.backend) {
            for (bool fresh = false, resent = false;;) {
                UpEvent error;
                std::unique_ptr<DetachedBody> body = send_http(*ep.cfg, active_request(), cfg_.upstream, fresh, error, gw_.liveness_.get());
                Attempt a = body ? relay(std::move(body), ep) : on_event(std::move(error), ep).value_or(Attempt::retry);
                if (a == Attempt::resend && !resent) {
                    resent = true;
                    continue;
                }
                if (a == Attempt::resend) return Attempt::final;
                if (a != Attempt::again || fresh) return a == Attempt::again ? Attempt::retry : a;
                fresh = true;
                // A race the pool's look cannot see (the backend closed as the request left): rare.
                log::info("upstream", "the backend had closed the pooled connection to " + ep.cfg->name + "; sending again on a fresh one");
            }
        }
        std::unique_ptr<UpstreamStream> up = ep.backend->open(upstream_body(), id_, cfg_.upstream);
        // Short waits, so a client that left or the drain deadline are noticed promptly; a
        // backend's stream_next returns as soon as it has a chunk, so they cost nothing when busy.
        const milliseconds wait = std::min(keepalive_, milliseconds(200));
        for (;;) {
            // Drain what is already queued before flushing: under load many tokens go out in
            // one write instead of one syscall each.
            UpEvent e = up->next(milliseconds(0));
            if (e.kind == UpEvent::Kind::timeout) {
                flush();
                e = up->next(wait);
            }
            if (!lost_ && steady_clock::now() - last_gone_check_ > milliseconds(100)) {
                last_gone_check_ = steady_clock::now();
                if (ex_.client_gone()) lost_ = true;
            }
            if (lost_) {
                up->cancel();
                return cancel_stream();
            }
            if (gw_.cutting()) {
                up->cancel();
                e = cut_event();
            }
            if (auto a = on_event(std::move(e), ep)) return *a;
        }
    }

    Attempt cancel_stream() {
        call_.reset();
        vt_->stream_finish(stream_, &call_, PULSE_STREAM_CANCELLED, builder_.get());
        outcome_ = Outcome::cancelled;
        return Attempt::final;
    }

    // Endpoint `ep` failed during this attempt (dropped, timed out, or sent what cannot be read):
    // before any output another endpoint, or this one later, serves the request; after output
    // the response is resumed elsewhere when it can be, else it ends here.
    Attempt endpoint_failure(const EndpointRef& ep, pulse_status_t status, const std::string& why) {
        last_status_ = status;
        last_error_ = why;
        if (gw_.cutting() || !retryable(last_status_)) {
            // No other endpoint is tried: the gateway is stopping, or the backend plugin
            // failed in a way that says it would fail again (a bug, not an outage).
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed: " + why);
            if (builder_->has_output()) {
                call_.reset();
                vt_->stream_finish(stream_, &call_, PULSE_STREAM_TRUNCATED, builder_.get());
                builder_->fail(last_status_, why);
                outcome_ = Outcome::failed;
                return Attempt::served;
            }
            return Attempt::final;
        }
        if (!builder_->attempt_has_output()) {
            // Nothing of this attempt reached the client (at most the role chunk, which
            // carries no output): another endpoint, or this one later, may serve it.
            log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " failed: " + why);
            gw_.endpoint_failed(ep, why, /*real_request=*/true);
            if (fed_ && open_profile_stream() != PULSE_OK) return Attempt::final;  // the profile starts afresh
            return Attempt::retry;
        }
        if (auto a = resume_elsewhere(ep, why)) return *a;
        call_.reset();
        vt_->stream_finish(stream_, &call_, PULSE_STREAM_TRUNCATED, builder_.get());
        outcome_ = outcome_of(builder_->end(PULSE_STREAM_TRUNCATED, why));
        return Attempt::served;
    }

    // One event from endpoint `ep`; a value when the attempt is over. Runs on the request's
    // thread (backend plugins) or on the stream loop's (HTTP), never on both at once.
    std::optional<Attempt> on_event(UpEvent e, const EndpointRef& ep) {
        switch (e.kind) {
            case UpEvent::Kind::timeout:
                keepalive_if_due();
                return std::nullopt;
            case UpEvent::Kind::accepted:
                served_by_ = ep.cfg->name;
                gw_.endpoint_ok(model_id_, ep, /*real_request=*/true);
                builder_->start();
                entry_->accepted();
                return std::nullopt;
            case UpEvent::Kind::rejected: {
                if (e.http_status == 400 && budget_ && !resuming_ && drop_refused_budget(ep, e.text)) return Attempt::resend;
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
                if (e.retry_after_s > 0) retry_after_s_ = e.retry_after_s;
                log::warn("responses", id_ + ": endpoint " + ep.cfg->name + " refused the request: " + last_error_);
                if (!retryable(s)) return Attempt::final;
                if (e.http_status == 500) {
                    // A server that answers 500 is up; one that answers this request with the
                    // same 500 twice will answer it so every time (an input it cannot take):
                    // it is not asked again, and not marked down for it. Other endpoints may
                    // still serve the request; when none is left, the answer is this error.
                    auto [it, first] = refusals_.try_emplace(&ep, e.text);
                    if (!first && it->second == e.text) {
                        refused_for_good_.insert(&ep);
                        deterministic_error_ = "the backend fails this request the same way each time (HTTP 500 twice): " + last_error_;
                    }
                    it->second = e.text;
                    return Attempt::retry;
                }
                gw_.endpoint_failed(ep, last_error_, /*real_request=*/true);
                return Attempt::retry;
            }
            case UpEvent::Kind::failed:
                if (e.stale) return Attempt::again;
                return endpoint_failure(ep, e.status ? e.status : PULSE_E_UNAVAILABLE, e.text);
            case UpEvent::Kind::data: {
                if (!ttft_) ttft_ = duration_cast<milliseconds>(steady_clock::now() - t0_);
                fed_ = true;
                call_.reset();
                pulse_status_t s = vt_->stream_feed(stream_, &call_, {e.text.data(), e.text.size()}, builder_.get());
                // A profile's feed answering UNAVAILABLE says the upstream's stream failed at
                // this chunk (an engine error event, a chunk that is not JSON): the endpoint
                // failed as if it had dropped here — another endpoint before any output, resume
                // after (docs/SDK.md, "Status codes").
                if (s < 0 && retryable(s))
                    return endpoint_failure(ep, s, "the backend's stream failed: " + host::call_error(call_, s, rt_->profile->plugin_id()));
                if (s < 0) {
                    builder_->fail(s, host::call_error(call_, s, rt_->profile->plugin_id()));
                    outcome_ = Outcome::failed;
                    return Attempt::served;
                }
                // The model's output could not be delivered (a broken tool call, reported through
                // the sink) after output began: another endpoint continues the response.
                if (auto f = builder_->failure(); f && retryable(f->first) && builder_->attempt_has_output()) {
                    last_status_ = f->first;
                    last_error_ = f->second;
                    if (auto a = resume_elsewhere(ep, "the backend's output could not be used mid-stream: " + f->second)) return *a;
                }
                entry_->output(builder_->spent().output);
                keepalive_if_due();
                return std::nullopt;
            }
            case UpEvent::Kind::done: {
                call_.reset();
                pulse_status_t s = vt_->stream_finish(stream_, &call_, PULSE_STREAM_CLEAN, builder_.get());
                if (s < 0) builder_->fail(s, host::call_error(call_, s, rt_->profile->plugin_id()));
                outcome_ = builder_->ended() ? (builder_->failure() ? Outcome::failed : Outcome::completed)
                                             : outcome_of(builder_->end(PULSE_STREAM_CLEAN));
                if (outcome_ == Outcome::completed || outcome_ == Outcome::incomplete) {
                    // Replays go to the chat path: a raw completion (resume = "tokens") is not kept.
                    if (upreq_.path == "/chat/completions" && !upreq_.root_path)
                        gw_.prefixes_->remember(model_id_, conversation_, upreq_.body.text());
                    if (gw_.warmer_ && !ep.backend) {
                        gw_.warmer_->served(*ep.cfg, ep.health);
                        if (auto u = builder_->usage_totals(); u.reported) gw_.warmer_->first_turn(*ep.cfg, *ep.health, u.input, u.cached);
                    }
                }
                return Attempt::served;
            }
        }
        return std::nullopt;
    }

    // A sent HTTP request's response, followed by the stream loop while this thread sleeps.
    Attempt relay(std::unique_ptr<DetachedBody> body, const EndpointRef& ep) {
        flush();
        if (lost_) return cancel_stream();  // `body` closes the connection
        relay_ep_ = &ep;
        relay_result_.reset();
        relaying_ = true;
        std::string unsent;
        gw_.relay_->run(*this, std::move(body), unsent);
        relaying_ = false;
        writer_.put_back(std::move(unsent));
        return relay_result_.value_or(Attempt::final);
    }

public:  // RelayJob: called on the stream loop's thread while relay() waits
    server::Exchange& client() override { return ex_; }
    bool on_upstream(UpEvent e) override {
        relay_result_ = on_event(std::move(e), *relay_ep_);
        return relay_result_.has_value();
    }
    bool on_timer() override {
        keepalive_if_due();
        return false;
    }
    void on_cut() override {
        relay_result_ = on_event(cut_event(), *relay_ep_);
        if (!relay_result_) relay_result_ = Attempt::final;
    }
    steady_clock::time_point next_timer() const override { return streaming_ ? last_event_ + keepalive_ : steady_clock::time_point::max(); }
    void on_client_lost() override {
        lost_ = true;
        relay_result_ = cancel_stream();
    }
    void take_output(std::string& wire) override { writer_.take(wire); }

private:
    // Waits before the next round, keeping the client alive and noticing if it leaves.
    void wait_backoff(steady_clock::duration d) {
        entry_->waiting();
        auto until = steady_clock::now() + d;
        while (!lost_ && !gw_.cutting() && steady_clock::now() < until) {
            std::this_thread::sleep_for(std::min<steady_clock::duration>(milliseconds(50), until - steady_clock::now()));
            if (ex_.client_gone()) lost_ = true;
            keepalive_if_due();
        }
    }

    void serve() {
        const auto deadline = window_end();
        const size_t regular = static_cast<size_t>(
            std::count_if(rt_->endpoints.begin(), rt_->endpoints.end(), [](const EndpointRef& e) { return !e.cfg->last_resort; }));
        milliseconds backoff(250);
        Attempt a = Attempt::retry;
        for (int round = 0;; ++round) {
            a = Attempt::retry;
            // Every other endpoint is known to be down: the last resort serves now, not after
            // the window (a server that comes back takes the next requests again).
            if (!tried_last_resort_ && !rt_->regular_healthy() && !rt_->last_resorts().empty()) {
                a = serve_last_resort("all_down", "every other endpoint is down");
                if (a != Attempt::retry || lost_ || gw_.cutting()) break;
            }
            auto order = rt_->order(conversation_);
            if (round == 0 && rt_->cfg->routing == config::Model::Routing::sticky && !order.empty() && order.front() != rt_->home(conversation_))
                metrics::global()
                    .counter("pulse_sticky_moved_total", "sticky requests that started away from their conversation's endpoint (it was down)",
                             {{"model", model_id_}})
                    .add();
            std::erase_if(order, [&](size_t i) { return refused_for_good_.count(&rt_->endpoints[i]) > 0; });
            if (order.empty() && !deterministic_error_.empty()) {
                last_status_ = PULSE_E_INVALID_ARGUMENT;
                last_error_ = deterministic_error_;
                return;  // the request's own fault: no last resort either
            }
            for (size_t n = 0; n < order.size() && a == Attempt::retry && !lost_ && !gw_.cutting(); ++n) {
                if (round > 0 || n > 0) {
                    if (!builder_->has_output()) entry_->failover();  // a resume's move is counted as one
                    metrics::global()
                        .counter(round > 0 && n == 0 ? metrics::kRetries.name : metrics::kFailovers.name,
                                 round > 0 && n == 0 ? metrics::kRetries.help : metrics::kFailovers.help,
                                 {{"model", model_id_}})
                        .add();
                }
                a = attempt(order[n]);
            }
            if (a != Attempt::retry || lost_ || gw_.cutting()) break;
            if (refused_for_good_.size() == regular) continue;  // answered at the top of the next round
            // The window is used to its end: the last round starts at the deadline.
            const auto now = steady_clock::now();
            if (now >= deadline) break;
            wait_backoff(std::min<steady_clock::duration>(backoff, deadline - now));
            backoff = std::min(backoff * 2, milliseconds(5000));
        }
        if (a == Attempt::retry && !lost_ && !gw_.cutting() && !tried_last_resort_ && retryable(last_status_) && !rt_->last_resorts().empty())
            serve_last_resort("window_spent", "no other endpoint took the request within the retry window");
        if (lost_ && outcome_ == Outcome::none) outcome_ = Outcome::cancelled;
    }

    // The request goes to the model's last-resort endpoints (at most once per request), marked
    // in the response head (X-Pulse-Fallback), the log and pulse_last_resort_requests_total.
    Attempt serve_last_resort(const char* reason, const char* why) {
        tried_last_resort_ = true;
        Attempt a = Attempt::retry;
        for (size_t i : rt_->last_resorts()) {
            const EndpointRef& ep = rt_->endpoints[i];
            log::warn("responses", id_ + ": served by the last-resort endpoint " + ep.cfg->name + ": " + why);
            metrics::global()
                .counter("pulse_last_resort_requests_total", "requests sent to a last-resort endpoint because no other could serve them",
                         {{"model", model_id_}, {"endpoint", ep.cfg->name}, {"reason", reason}})
                .add();
            last_resort_ = ep.cfg->name;
            if (streaming_) writer_.add_header("X-Pulse-Fallback", "last-resort; endpoint=" + last_resort_);
            a = attempt(i);
            if (a != Attempt::retry || lost_ || gw_.cutting()) break;
        }
        return a;
    }

    // The response's end: the terminal event or the error, the request's record (trace,
    // metrics, log), then the last bytes. A client that saw the end sees its accounting.
    void finish() {
        if (outcome_ == Outcome::invalid) return;  // answered and counted
        std::optional<std::string> answer;         // a whole (non-streamed) response, written after the record
        int answer_status = 200;
        server::Headers answer_headers;
        if (!last_resort_.empty()) answer_headers.emplace_back("X-Pulse-Fallback", "last-resort; endpoint=" + last_resort_);
        if (!budget_header_.empty()) answer_headers.emplace_back("X-Pulse-Reasoning-Budget", budget_header_);
        auto error_answer = [&](pulse_status_t s, const std::string& msg, const char* code = nullptr) {
            auto h = http_error_for(s);
            answer_status = h.status;
            int retry = h.retry_after ? std::max(h.retry_after, retry_after_s_) : 0;
            if (retry > 0) answer_headers.emplace_back("Retry-After", std::to_string(retry));
            answer = error_body(h.type, msg, {}, code ? code : h.code);
        };
        if (outcome_ == Outcome::none || outcome_ == Outcome::rejected) {
            // Only a request that went through the failover rounds spent the window; a profile
            // that refused it (outcome rejected) was answered at once, whatever its status.
            const bool window_spent = outcome_ == Outcome::none && retryable(last_status_);
            if (outcome_ == Outcome::none) outcome_ = window_spent ? Outcome::unavailable : Outcome::rejected;
            std::string msg = gw_.cutting() ? last_error_
                              : window_spent ? "no backend could take the request within " +
                                                   std::to_string(static_cast<int>(cfg_.upstream.retry_window_s)) + " s; last error: " + last_error_
                                             : last_error_;
            if (streaming_ && builder_ && builder_->started())
                builder_->fail(last_status_, msg);  // SSE already open (keepalives): a terminal event
            else
                error_answer(last_status_, msg);
        } else if (!streaming_ && outcome_ != Outcome::cancelled) {
            if (auto f = builder_->failure(); f && !builder_->has_output())
                error_answer(f->first, f->second, f->first == PULSE_E_CONTEXT_LENGTH ? "context_length_exceeded" : nullptr);
            else
                answer = builder_->final_response();
        }
        // Everything but the very end leaves first, so a client that stopped reading is known
        // before the request is recorded.
        if (streaming_ && !answer && outcome_ != Outcome::cancelled && !lost_ && !writer_.flush()) lost_ = true;
        if (lost_ && outcome_ != Outcome::cancelled) outcome_ = Outcome::client_lost;
        record();
        if (outcome_ == Outcome::cancelled || outcome_ == Outcome::client_lost) return;
        bool delivered = answer ? (send_json(ex_, answer_status, *answer, answer_headers), !ex_.lost()) : writer_.end();
        if (!delivered) log::warn("responses", id_ + ": the client did not take the end of the response (" + name(outcome_) + ")");
    }

    void record() {
        if (!cfg_.server.trace_file.empty() && builder_ && builder_->ended()) trace(cfg_.server.trace_file, id_, "response", builder_->final_response());
        auto& reg = metrics::global();
        const std::string ep = served_by_.empty() ? "-" : served_by_;
        reg.counter(metrics::kRequests.name, metrics::kRequests.help,
                    {{"model", model_id_}, {"endpoint", ep}, {"outcome", name(outcome_)}})
            .add();
        double total_s = duration<double>(steady_clock::now() - t0_).count();
        reg.histogram("pulse_request_duration_seconds", "whole request, receipt to last byte", {{"model", model_id_}}).observe(total_s);
        if (ttft_) reg.histogram(metrics::kTtft.name, metrics::kTtft.help, {{"model", model_id_}}).observe(ttft_->count() / 1000.0);
        ResponseBuilder::Usage u;
        if (builder_) u = builder_->usage_totals();
        reg.counter("pulse_input_tokens_total", "prompt tokens reported by backends", {{"model", model_id_}}).add(static_cast<uint64_t>(u.input));
        reg.counter("pulse_cached_tokens_total", "prompt tokens served from the backend prefix cache", {{"model", model_id_}})
            .add(static_cast<uint64_t>(u.cached));
        reg.counter("pulse_output_tokens_total", "output tokens reported by backends", {{"model", model_id_}}).add(static_cast<uint64_t>(u.output));
        if (budget_ && builder_ && builder_->ended()) {
            reg.counter("pulse_reasoning_budget_tokens_total", "reasoning budgets of finished requests that had one, summed", {{"model", model_id_}})
                .add(static_cast<uint64_t>(*budget_));
            reg.counter("pulse_budgeted_reasoning_tokens_total", "reasoning tokens of finished requests that had a budget", {{"model", model_id_}})
                .add(static_cast<uint64_t>(u.reasoning));
            if (u.reasoning > *budget_)
                reg.counter("pulse_reasoning_over_budget_total", "finished requests whose reasoning went past their budget", {{"model", model_id_}})
                    .add();
        }
        // in/cached are "-" when no backend reported usage (a stream that failed or was cancelled
        // before its last chunk); out then counts the deltas that reached the client.
        const auto known = [&](int64_t v) { return u.reported ? std::to_string(v) : std::string("-"); };
        const int64_t out = builder_ ? builder_->spent().output : 0;
        RequestBoard::Ended ended;
        ended.outcome = name(outcome_);
        ended.ttft_ms = ttft_ ? ttft_->count() : -1;
        ended.total_ms = duration_cast<milliseconds>(steady_clock::now() - t0_).count();
        ended.input = u.reported ? u.input : -1;
        ended.cached = u.reported ? u.cached : -1;
        ended.output = out;
        ended.budget = budget_.value_or(-1);
        ended.budget_enforced = budget_enforced_;
        gw_.board_.end(entry_, ended);
        log::info("responses", id_ + " model=" + model_id_ + " endpoint=" + ep + " outcome=" + name(outcome_) + " in=" + known(u.input) +
                                   " cached=" + known(u.cached) + " out=" + std::to_string(out) +
                                   " ttft_ms=" + (ttft_ ? std::to_string(ttft_->count()) : "-") +
                                   (resumes_ ? " resumed=" + std::to_string(resumes_) : std::string()) +
                                   " total_ms=" + std::to_string(duration_cast<milliseconds>(steady_clock::now() - t0_).count()));
    }

    Gateway& gw_;
    server::Exchange& ex_;
    std::shared_ptr<const Snapshot> snap_;  // the config generation this request uses, to its end
    const config::Config& cfg_;
    const std::string id_;
    const steady_clock::time_point t0_ = steady_clock::now();

    rapidjson::Document doc_;  // parsed in place: its strings point into ex_.body()
    std::string model_id_, conversation_;  // conversation_: conversation_key() of the request
    const ModelRuntime* rt_ = nullptr;
    bool streaming_ = false;

    const pulse_translation_vt_t* vt_ = nullptr;
    std::atomic<bool> cancelled_{false};
    pulse_call call_;
    pulse_upstream_req upreq_;
    void* stream_ = nullptr;
    std::unique_ptr<ResponseBuilder> builder_;
    bool resuming_ = false;                           // the response continues an earlier attempt
    std::unique_ptr<pulse_upstream_req> resume_req_;  // the request that continues it (resuming_)
    std::pair<size_t, size_t> resumed_from_;  // the last resume request: bytes of text and of reasoning it continued
    std::string resumed_by_;                  // "by tokens", or "by text (why)"
    std::unique_ptr<pulse_upstream_req> prep_req_;  // the profile's preparatory request (SDK 1.3 prepare), if any
    rapidjson::Document prepared_;                  // its answer, once an endpoint gave it
    bool built_ = false;                            // upreq_ is written (at once, or after the preparation)
    int resumes_ = 0;
    std::optional<int64_t> budget_;  // the request's reasoning budget, if it has one
    bool budget_enforced_ = false;
    std::string budget_header_;      // X-Pulse-Reasoning-Budget

    ClientWriter writer_;
    bool lost_ = false;
    milliseconds keepalive_{10000};
    steady_clock::time_point last_event_ = steady_clock::now();
    steady_clock::time_point last_gone_check_ = steady_clock::now();
    bool fed_ = false;  // the current attempt produced data

    bool relaying_ = false;  // the stream loop sends this response's bytes now
    const EndpointRef* relay_ep_ = nullptr;
    std::optional<Attempt> relay_result_;

    pulse_status_t last_status_ = PULSE_E_UNAVAILABLE;
    std::string last_error_ = "no endpoint configured";
    int retry_after_s_ = 0;  // the longest Retry-After a backend asked for
    std::map<const EndpointRef*, std::string> refusals_;  // the last HTTP 500 body per endpoint
    std::set<const EndpointRef*> refused_for_good_;        // answered this request with the same 500 twice
    std::string deterministic_error_;
    bool tried_last_resort_ = false;
    std::string last_resort_;  // the last-resort endpoint this request went to, if any
    std::string served_by_;
    Outcome outcome_ = Outcome::none;
    std::optional<milliseconds> ttft_;
    std::shared_ptr<RequestBoard::Entry> entry_;  // what the status page shows of this request
};

void Gateway::responses(server::Exchange& ex) {
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
    if (draining_) {
        ex.close_after();
        return send_error(ex, 503, "server_error", "the gateway is shutting down; retry shortly", {}, "draining", 1);
    }
    if (active_.load() > snap->cfg.server.max_streams) {
        // The server keeps spare workers so an over-capacity request still gets a clear answer.
        metrics::global().counter(metrics::kCapacityRejections.name, metrics::kCapacityRejections.help).add();
        return send_error(ex, 503, "server_error",
                          "the gateway is at capacity (" + std::to_string(snap->cfg.server.max_streams) +
                              " requests in flight, server.max_streams); retry shortly",
                          {}, "at_capacity", 1);
    }
    ResponseSession(*this, ex).run();
}

}  // namespace pulse::gateway
