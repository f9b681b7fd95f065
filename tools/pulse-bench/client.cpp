#include "pulse-bench/client.h"

#include <Poco/URI.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <chrono>
#include <memory>
#include <stdexcept>

#include "gateway/protocol/sse.h"
#include "http/client.h"

namespace pulse::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string dump(const rapidjson::Value& v) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    v.Accept(w);
    return {b.GetString(), b.GetSize()};
}

std::string str(const rapidjson::Value& v, const char* k) {
    if (!v.IsObject()) return {};
    auto it = v.FindMember(k);
    return it != v.MemberEnd() && it->value.IsString() ? it->value.GetString() : std::string();
}
int64_t i64(const rapidjson::Value& v, const char* k) {
    if (!v.IsObject()) return -1;
    auto it = v.FindMember(k);
    return it != v.MemberEnd() && it->value.IsInt64() ? it->value.GetInt64() : -1;
}
const rapidjson::Value* member(const rapidjson::Value& v, const char* k) {
    if (!v.IsObject()) return nullptr;
    auto it = v.FindMember(k);
    return it == v.MemberEnd() ? nullptr : &it->value;
}

http::Request request_for(const std::string& method, const std::string& url, const std::string& key) {
    http::Request req;
    req.method = method;
    req.target = Poco::URI(url).getPathAndQuery();
    if (!key.empty()) req.fields.emplace_back("Authorization", "Bearer " + key);
    return req;
}

HttpReply request(const std::string& method, const std::string& url, const std::string* body, double timeout_s, const std::string& key) {
    HttpReply r;
    try {
        http::Request req = request_for(method, url, key);
        if (body) req.body = *body;
        http::Answer a = http::fetch(url, req, http::Timeouts::all(timeout_s), 64u << 20);
        r.status = a.status;
        r.reasoning_budget = a.field("X-Pulse-Reasoning-Budget");
        r.body = std::move(a.body);
        r.error = std::move(a.error);
    } catch (const std::exception& e) {  // a malformed URL
        r.error = e.what();
    }
    return r;
}

// Streams `body` to `url` and feeds each SSE event to on_event(name, data, seconds).
template <class F>
StreamResult stream(const std::string& url, const rapidjson::Document& body, double timeout_s, const std::string& key, F&& on_event) {
    StreamResult r;
    const auto t0 = Clock::now();
    auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    try {
        std::string text = dump(body);
        http::Request req = request_for("POST", url, key);
        req.body = text;
        req.fields.emplace_back("Accept", "text/event-stream");
        std::string error;
        auto st = http::open(url, req, http::Timeouts::all(timeout_s), &error);
        if (!st) {
            r.error = error;
            return r;
        }
        std::istream& in = st->body();
        r.status = st->status();
        if (r.status != 200) {
            std::string b(std::istreambuf_iterator<char>(in), {});
            r.error = "HTTP " + std::to_string(r.status) + ": " + b.substr(0, 300);
            return r;
        }
        gateway::SseParser parser;
        char buf[16384];
        bool done = false;
        // One blocking byte, then whatever else the stream buffer holds: istream::read would
        // wait for a full buffer and stamp every event with the time the buffer filled.
        while (!done) {
            int c = in.get();
            if (c == std::char_traits<char>::eof()) break;
            buf[0] = static_cast<char>(c);
            std::streamsize n = 1 + in.readsome(buf + 1, sizeof buf - 1);
            parser.feed(std::string_view(buf, static_cast<size_t>(n)), [&](std::string_view name, std::string_view data) {
                if (!done) done = on_event(r, name, data, since());
            });
        }
        r.end = since();
        r.ok = done && r.error.empty();
        if (!done && r.error.empty()) r.error = "the stream ended without its terminal event";
    } catch (const std::exception& e) {
        r.error = e.what();
    }
    return r;
}

void set_member(rapidjson::Document& d, const char* k, rapidjson::Value v) {
    auto& a = d.GetAllocator();
    if (d.HasMember(k)) d[k] = v;
    else d.AddMember(rapidjson::Value(k, a), v, a);
}

}  // namespace

std::string Endpoint::root() const {
    std::string r = base;
    while (!r.empty() && r.back() == '/') r.pop_back();
    if (r.size() >= 3 && r.compare(r.size() - 3, 3, "/v1") == 0) r.resize(r.size() - 3);
    return r;
}

Endpoint parse_endpoint(const std::string& spec, const std::string& default_name) {
    Endpoint e;
    e.name = default_name;
    std::string url = spec;
    auto eq = spec.find('=');
    if (eq != std::string::npos && spec.find("://") > eq) {
        e.name = spec.substr(0, eq);
        url = spec.substr(eq + 1);
    }
    if (auto hash = url.find('#'); hash != std::string::npos) {
        e.model = url.substr(hash + 1);
        url.resize(hash);
        if (e.model.empty()) throw std::invalid_argument("endpoint '" + spec + "' names no model after '#'");
    }
    if (url.rfind("http://", 0) != 0) throw std::invalid_argument("endpoint '" + spec + "' must be [NAME=]http://host:port/v1[#MODEL]");
    while (!url.empty() && url.back() == '/') url.pop_back();
    e.base = url;
    return e;
}

HttpReply http_get(const std::string& url, double timeout_s, const std::string& key) { return request("GET", url, nullptr, timeout_s, key); }
HttpReply http_post(const std::string& url, const std::string& body, double timeout_s, const std::string& key) {
    return request("POST", url, &body, timeout_s, key);
}

double StreamResult::decode_tps() const {
    if (completion_tokens < 2 || ttft < 0 || last_token <= ttft) return 0;
    return static_cast<double>(completion_tokens - 1) / (last_token - ttft);
}

StreamResult stream_chat(const Endpoint& ep, rapidjson::Document body, double timeout_s) {
    auto& a = body.GetAllocator();
    set_member(body, "stream", rapidjson::Value(true));
    rapidjson::Value so(rapidjson::kObjectType);
    so.AddMember("include_usage", true, a);
    set_member(body, "stream_options", std::move(so));
    if (!ep.model.empty()) set_member(body, "model", rapidjson::Value(ep.model.c_str(), a));
    return stream(ep.base + "/chat/completions", body, timeout_s, ep.api_key,
                  [](StreamResult& r, std::string_view, std::string_view data, double t) {
                      if (data == "[DONE]") return true;
                      rapidjson::Document c;
                      c.Parse(data.data(), data.size());
                      if (c.HasParseError() || !c.IsObject()) return false;
                      if (const auto* err = member(c, "error")) {
                          r.error = "stream error: " + (err->IsObject() ? str(*err, "message") : dump(*err));
                          return true;
                      }
                      if (const auto* ch = member(c, "choices"); ch && ch->IsArray() && !ch->Empty()) {
                          const auto& choice = (*ch)[0];
                          if (const auto* d = member(choice, "delta")) {
                              std::string content = str(*d, "content");
                              std::string reasoning = str(*d, "reasoning");
                              if (reasoning.empty()) reasoning = str(*d, "reasoning_content");
                              if (!content.empty() || !reasoning.empty()) {
                                  if (r.ttft < 0) r.ttft = t;
                                  r.last_token = t;
                                  ++r.output_chunks;
                              }
                              r.text += content;
                              r.reasoning += reasoning;
                          }
                          if (std::string f = str(choice, "finish_reason"); !f.empty()) r.finish_reason = f;
                      }
                      if (const auto* u = member(c, "usage"); u && u->IsObject()) {
                          r.prompt_tokens = i64(*u, "prompt_tokens");
                          r.completion_tokens = i64(*u, "completion_tokens");
                          if (const auto* d = member(*u, "prompt_tokens_details")) r.cached_tokens = i64(*d, "cached_tokens");
                          if (const auto* d = member(*u, "completion_tokens_details")) r.reasoning_tokens = i64(*d, "reasoning_tokens");
                      }
                      if (const auto* tm = member(c, "timings"); tm && tm->IsObject()) {
                          r.draft_n = i64(*tm, "draft_n");
                          r.draft_accepted = i64(*tm, "draft_n_accepted");
                          if (r.cached_tokens < 0) r.cached_tokens = i64(*tm, "cache_n");
                      }
                      return false;
                  });
}

StreamResult stream_responses(const Endpoint& ep, rapidjson::Document body, double timeout_s) {
    auto& a = body.GetAllocator();
    set_member(body, "stream", rapidjson::Value(true));
    if (!ep.model.empty()) set_member(body, "model", rapidjson::Value(ep.model.c_str(), a));
    return stream(ep.base + "/responses", body, timeout_s, ep.api_key,
                  [](StreamResult& r, std::string_view name, std::string_view data, double t) {
                      rapidjson::Document e;
                      e.Parse(data.data(), data.size());
                      if (e.HasParseError() || !e.IsObject()) return false;
                      std::string type = str(e, "type");
                      if (type.empty()) type = std::string(name);
                      if (type == "response.output_text.delta" || type == "response.reasoning_text.delta" ||
                          type == "response.reasoning_summary_text.delta") {
                          if (r.ttft < 0) r.ttft = t;
                          r.last_token = t;
                          ++r.output_chunks;
                          (type == "response.output_text.delta" ? r.text : r.reasoning) += str(e, "delta");
                      }
                      if (type == "response.completed" || type == "response.failed" || type == "response.incomplete") {
                          if (const auto* resp = member(e, "response")) {
                              if (const auto* u = member(*resp, "usage")) {
                                  r.prompt_tokens = i64(*u, "input_tokens");
                                  r.completion_tokens = i64(*u, "output_tokens");
                                  if (const auto* d = member(*u, "input_tokens_details")) r.cached_tokens = i64(*d, "cached_tokens");
                                  if (const auto* d = member(*u, "output_tokens_details")) r.reasoning_tokens = i64(*d, "reasoning_tokens");
                              }
                              if (type == "response.failed")
                                  if (const auto* err = member(*resp, "error")) r.error = "response.failed: " + str(*err, "message");
                          }
                          r.finish_reason = type.substr(9);
                          return true;
                      }
                      return false;
                  });
}

BackendInfo probe_backend(const Endpoint& ep, double timeout_s) {
    BackendInfo info;
    HttpReply m = http_get(ep.base + "/models", timeout_s, ep.api_key);
    rapidjson::Document d;
    d.Parse(m.body.c_str());
    if (m.status == 200 && !d.HasParseError() && d.IsObject()) {
        if (const auto* data = member(d, "data"); data && data->IsArray())
            for (const auto& e : data->GetArray()) {
                if (!ep.model.empty() && str(e, "id") != ep.model) continue;
                info.model = str(e, "id");
                info.owned_by = str(e, "owned_by");
                info.root = str(e, "root");
                info.max_model_len = i64(e, "max_model_len");
                if (const auto* meta = member(e, "meta"); meta && info.max_model_len < 0) info.max_model_len = i64(*meta, "n_ctx_train");
                break;
            }
    }
    HttpReply v = http_get(ep.root() + "/version", timeout_s, ep.api_key);
    rapidjson::Document vd;
    vd.Parse(v.body.c_str());
    if (v.status == 200 && !vd.HasParseError()) info.version = str(vd, "version");
    HttpReply p = http_get(ep.root() + "/props", timeout_s, ep.api_key);
    rapidjson::Document pd;
    pd.Parse(p.body.c_str());
    if (p.status == 200 && !pd.HasParseError() && pd.IsObject()) {
        rapidjson::Document sel(rapidjson::kObjectType);
        auto& a = sel.GetAllocator();
        for (const char* k : {"build_info", "total_slots", "model_path", "chat_template_caps", "speculative"})
            if (const auto* x = member(pd, k)) sel.AddMember(rapidjson::Value(k, a), rapidjson::Value(*x, a), a);
        if (const auto* g = member(pd, "default_generation_settings"))
            if (const auto* n = member(*g, "n_ctx")) sel.AddMember("n_ctx", rapidjson::Value(*n, a), a);
        info.props = dump(sel);
        if (info.version.empty()) info.version = str(pd, "build_info");
        if (info.max_model_len < 0 && sel.HasMember("n_ctx") && sel["n_ctx"].IsInt64()) info.max_model_len = sel["n_ctx"].GetInt64();
    }
    return info;
}

}  // namespace pulse::bench
