// The shipped request policies (SDK 1.1 policy kind; docs/OPERATIONS.md "Policies"):
//   static  a reasoning budget per reasoning effort, from the model's TOML;
//   http    asks a decision service: POST the request summary as JSON, read the decision back.
#include <pulse/plugin.hpp>

#include <Poco/URI.h>
#include <time.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>

#include "http/client.h"

namespace {

const pulse_host_api_t* g_host = nullptr;

const char* const kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
bool known_effort(std::string_view e) {
    for (const char* k : kEfforts)
        if (e == k) return true;
    return false;
}

// ---- static ----
struct Static {
    std::map<std::string, int64_t, std::less<>> budgets;  // by effort
    std::string default_effort = "medium";
};

pulse_status_t static_create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        auto p = std::make_unique<Static>();
        pulse::Json cfg(g_host->json, config);
        for (size_t i = 0; i < cfg.size(); ++i) {
            auto [key, v] = cfg.member_at(i);
            if (key == "budgets") {
                if (!v.is_object()) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "static: budgets must be a table of effort = tokens");
                for (size_t j = 0; j < v.size(); ++j) {
                    auto [effort, n] = v.member_at(j);
                    if (!known_effort(effort))
                        throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "static: budgets." + std::string(effort) +
                                                                         ": not a reasoning effort (none, minimal, low, medium, high, xhigh)");
                    auto tokens = n.i64();
                    if (!tokens || *tokens < 0)
                        throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "static: budgets." + std::string(effort) + " must be an integer >= 0");
                    p->budgets[std::string(effort)] = *tokens;
                }
            } else if (key == "default_effort") {
                auto e = v.string();
                if (!e || !known_effort(*e))
                    throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "static: default_effort must be none, minimal, low, medium, high or xhigh");
                p->default_effort = std::string(*e);
            } else {
                throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "static: unknown option '" + std::string(key) + "' (allowed: budgets, default_effort)");
            }
        }
        if (p->budgets.empty()) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "static: budgets is required (e.g. budgets = { low = 1024, medium = 4096 })");
        *out = p.release();
        return PULSE_OK;
    });
}
void static_destroy(void* p) { delete static_cast<Static*>(p); }

pulse_status_t static_decide(void* policy, pulse_call_t* call, const pulse_json_t* request, pulse_json_writer_t* out) {
    return pulse::guard(g_host, call, [&] {
        const auto& p = *static_cast<Static*>(policy);
        pulse::Json req(g_host->json, request);
        std::string_view effort = req["effort"].string_or("");
        if (effort.empty()) effort = p.default_effort;
        pulse::Writer w(g_host->json, out);
        w.begin_object();
        if (auto it = p.budgets.find(effort); it != p.budgets.end()) w.kv("reasoning_budget", it->second);
        w.end_object();
        return w.ok() ? PULSE_OK : PULSE_E_INTERNAL;
    });
}

// ---- http ----
struct Http {
    Poco::URI url;
    int64_t timeout_ms = 150;
    std::string api_key;  // from the environment variable the options name
};

uint64_t now_ms() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

pulse_status_t http_create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        auto p = std::make_unique<Http>();
        pulse::Json cfg(g_host->json, config);
        std::string url;
        for (size_t i = 0; i < cfg.size(); ++i) {
            auto [key, v] = cfg.member_at(i);
            if (key == "url") {
                url = std::string(v.string_or(""));
            } else if (key == "timeout_ms") {
                auto t = v.i64();
                if (!t || *t < 1 || *t > 60000) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "http: timeout_ms must be an integer 1-60000");
                p->timeout_ms = *t;
            } else if (key == "api_key_env") {
                auto name = v.string();
                if (!name || name->empty()) throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "http: api_key_env must name an environment variable");
                const char* value = std::getenv(std::string(*name).c_str());
                if (!value || !*value)
                    throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "http: api_key_env: the environment variable " + std::string(*name) + " is not set");
                p->api_key = value;
            } else {
                throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "http: unknown option '" + std::string(key) + "' (allowed: url, timeout_ms, api_key_env)");
            }
        }
        try {
            p->url = Poco::URI(url);
        } catch (const std::exception&) {
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "http: url '" + url + "' is not a URL");
        }
        if (p->url.getScheme() != "http" || p->url.getHost().empty())
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "http: url must be http://HOST[:PORT]/PATH (found '" + url + "')");
        *out = p.release();
        return PULSE_OK;
    });
}
void http_destroy(void* p) { delete static_cast<Http*>(p); }

pulse_status_t http_decide(void* policy, pulse_call_t* call, const pulse_json_t* request, pulse_json_writer_t* out) {
    return pulse::guard(g_host, call, [&] {
        const auto& p = *static_cast<Http*>(policy);
        // Whichever comes first: our own timeout or the host's deadline for this call.
        int64_t budget_ms = p.timeout_ms;
        if (uint64_t deadline = g_host->call_deadline_ms(call)) {
            int64_t left = static_cast<int64_t>(deadline) - static_cast<int64_t>(now_ms());
            budget_ms = std::min(budget_ms, std::max<int64_t>(left, 1));
        }
        const std::string body = pulse::Json(g_host->json, request).dump();
        pulse::http::Request rq;
        rq.method = "POST";
        rq.target = p.url.getPathAndQuery();
        rq.body = body;
        if (!p.api_key.empty()) rq.fields.emplace_back("Authorization", "Bearer " + p.api_key);
        pulse::http::Answer got = pulse::http::fetch(p.url.toString(), rq, pulse::http::Timeouts::all(static_cast<double>(budget_ms) / 1000));
        if (got.timed_out)  // out of time (ours or the host's): the host counts it as a timeout, as documented
            throw pulse::Error(PULSE_E_DEADLINE, "http: the decision service at " + p.url.toString() + " did not answer within " +
                                                     std::to_string(budget_ms) + " ms");
        if (got.status == 0)
            throw pulse::Error(PULSE_E_UNAVAILABLE, "http: the decision service at " + p.url.toString() + " did not answer: " + got.error);
        const int status = got.status;
        const std::string& answer = got.body;
        if (status != 200)
            throw pulse::Error(PULSE_E_UNAVAILABLE, "http: the decision service answered HTTP " + std::to_string(status) + ": " +
                                                        answer.substr(0, 200));
        const pulse_json_t* decision = g_host->json->parse(call, pulse::str(answer));
        if (!decision) return PULSE_E_UNAVAILABLE;  // the parse error is the call's message
        pulse::Writer w(g_host->json, out);
        w.copy(pulse::Json(g_host->json, decision));  // the host checks what is in it
        return w.ok() ? PULSE_OK : PULSE_E_UNAVAILABLE;
    });
}

const pulse_policy_vt_t kStatic = {sizeof(pulse_policy_vt_t), "static", static_create, static_destroy, static_decide};
const pulse_policy_vt_t kHttp = {sizeof(pulse_policy_vt_t), "http", http_create, http_destroy, http_decide};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    *state = nullptr;
    if (!PULSE_HAS_FIELD(host, pulse_host_api_t, register_policy))
        return host->set_error(call, PULSE_E_ABI, pulse::str("this host has no policy kind (it needs plugin ABI 1.1)"));
    return pulse::guard(host, call, [&] {
        if (pulse_status_t rc = host->register_policy(ctx, &kStatic, sizeof kStatic, nullptr); rc != PULSE_OK) return rc;
        return host->register_policy(ctx, &kHttp, sizeof kHttp, nullptr);
    });
}

void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_POLICY, "pulse.policy", "0.1.0"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
