#include "gateway/request/request_plan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"
#include "gateway/snapshot.h"

namespace pulse::gateway {

using namespace std::chrono;

std::optional<int64_t> RequestPlan::output_limit() const {
    if (doc.HasMember("max_output_tokens") && doc["max_output_tokens"].IsInt64()) return doc["max_output_tokens"].GetInt64();
    return rt->cfg->sampling.max_output_tokens;
}

std::optional<int64_t> RequestPlan::reasoning_budget() const {
    if (!doc.HasMember("reasoning") || !doc["reasoning"].IsObject() || !doc["reasoning"].HasMember("budget_tokens") ||
        !doc["reasoning"]["budget_tokens"].IsInt64())
        return std::nullopt;
    return doc["reasoning"]["budget_tokens"].GetInt64();
}

std::optional<RequestError> plan_request(std::string& body, const Snapshot& snap, const std::string& response_id, RequestPlan& out) {
    out.body_bytes = body.size();
    if (auto e = parse_body_in_place(body, out.doc)) return e;
    // Traced once it is known to be JSON, so every trace line stays valid JSON.
    if (!snap.cfg.server.trace_file.empty()) {
        rapidjson::StringBuffer compact;  // one line, whatever whitespace the client sent
        rapidjson::Writer<rapidjson::StringBuffer> w(compact);
        out.doc.Accept(w);
        trace(snap.cfg.server.trace_file, response_id, "request", {compact.GetString(), compact.GetSize()});
    }
    if (auto e = validate_request(out.doc)) return e;
    out.model_id = out.doc["model"].GetString();
    out.rt = snap.find(out.model_id);
    if (!out.rt) {
        std::string known;
        for (const auto& r : snap.models) known += (known.empty() ? "" : ", ") + r->cfg->id;
        return RequestError{400, "model '" + out.model_id + "' is not configured here (models: " + (known.empty() ? "none" : known) + ")", "model",
                            "model_not_found"};
    }
    out.streaming = out.doc.HasMember("stream") && out.doc["stream"].IsTrue();
    out.conversation = conversation_key(out.doc);
    return std::nullopt;
}

void apply_policy(RequestPlan& plan, const std::string& response_id) {
    const Policy* pol = plan.rt->policy.get();
    if (!pol) return;
    rapidjson::StringBuffer b;
    {
        rapidjson::Writer<rapidjson::StringBuffer> w(b);
        auto kv = [&](const char* k, std::string_view v) {
            w.Key(k);
            w.String(v.data(), static_cast<rapidjson::SizeType>(v.size()));
        };
        w.StartObject();
        kv("model", plan.model_id);
        std::string effort;
        if (plan.doc.HasMember("reasoning") && plan.doc["reasoning"].IsObject() && plan.doc["reasoning"].HasMember("effort") &&
            plan.doc["reasoning"]["effort"].IsString())
            effort = plan.doc["reasoning"]["effort"].GetString();
        kv("effort", effort);
        w.Key("tools");
        w.StartArray();
        if (plan.doc.HasMember("tools") && plan.doc["tools"].IsArray())
            for (const auto& t : plan.doc["tools"].GetArray())
                if (t.IsObject() && t.HasMember("name") && t["name"].IsString()) w.String(t["name"].GetString());
        w.EndArray();
        w.Key("history_items");
        w.Uint64(plan.doc.HasMember("input") && plan.doc["input"].IsArray() ? plan.doc["input"].Size() : 1);
        kv("conversation", plan.conversation);
        w.Key("input_chars");
        w.Uint64(plan.body_bytes);
        w.Key("stream");
        w.Bool(plan.streaming);
        w.EndObject();
    }
    Policy::Decision d;
    std::string why;
    const auto outcome = pol->decide({b.GetString(), b.GetSize()}, response_id, d, why);
    metrics::global()
        .counter(metrics::kPolicyDecisions.name, metrics::kPolicyDecisions.help,
                 {{"model", plan.model_id}, {"policy", pol->component()}, {"outcome", Policy::name(outcome)}})
        .add();
    if (outcome != Policy::Outcome::applied) {
        if (outcome != Policy::Outcome::unchanged)
            log::warn("policy", response_id + ": policy '" + pol->component() + "' " + Policy::name(outcome) + ": " + why +
                                    "; the request goes on unchanged");
        return;
    }
    auto& a = plan.doc.GetAllocator();
    if (!plan.doc.HasMember("reasoning") || !plan.doc["reasoning"].IsObject()) {
        plan.doc.RemoveMember("reasoning");
        plan.doc.AddMember("reasoning", rapidjson::Value(rapidjson::kObjectType), a);
    }
    auto& r = plan.doc["reasoning"];
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
        if (plan.doc.HasMember(key)) plan.doc[key] = val;
        else plan.doc.AddMember(key, val, a);
        char num[32];
        std::snprintf(num, sizeof num, "%g", v);
        said += " " + k + "=" + num;
    }
    log::info("policy", response_id + ": policy '" + pol->component() + "' decided" + said);
}

std::optional<BudgetReport> budget_report(const RequestPlan& plan, const std::map<std::string, std::string>& notes) {
    auto budget = plan.reasoning_budget();
    if (!budget) return std::nullopt;
    BudgetReport r;
    r.budget = *budget;
    auto it = notes.find("reasoning_budget");
    r.how = it != notes.end() ? it->second : "not enforced: profile '" + plan.rt->profile->registration.name + "' does not apply reasoning budgets";
    // The field is named by itself since SDK 1.2; a 1.1 profile names it only in its note,
    // whose documented form is "enforced by FIELD".
    const auto f = notes.find("reasoning_budget_field");
    if (f != notes.end()) {
        r.field = f->second;
    } else if (r.how.rfind("enforced by ", 0) == 0) {
        r.field = r.how.substr(12);
        r.field = r.field.substr(0, r.field.find(' '));
    }
    // The profile wrote the budget into a field; an in-process backend says itself whether it
    // reads that field (an HTTP backend refuses a field it cannot apply: the driver resends).
    if (f != notes.end()) {
        std::string ignoring;
        size_t plugins = 0;
        for (const auto& ep : plan.rt->endpoints) {
            if (!ep.backend) continue;
            ++plugins;
            if (!ep.backend->enforces(f->second)) ignoring += (ignoring.empty() ? "'" : ", '") + ep.backend->name() + "'";
        }
        if (!ignoring.empty() && plugins == plan.rt->endpoints.size())
            r.how = "not enforced: backend " + ignoring + " does not enforce " + f->second;
        else if (!ignoring.empty())
            r.how += "; not by backend " + ignoring + ", which does not enforce " + f->second;
    }
    r.enforced = r.how.rfind("enforced", 0) == 0;
    if (!r.enforced) r.field.clear();
    return r;
}

std::string conversation_key(const rapidjson::Value& request) {
    if (!request.IsObject()) return "h:0";
    if (auto k = request.FindMember("prompt_cache_key"); k != request.MemberEnd() && k->value.IsString() && k->value.GetStringLength() > 0)
        return "k:" + std::string(k->value.GetString(), k->value.GetStringLength());
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    auto mix = [&h](std::string_view s) {
        for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;  // a separator no UTF-8 text contains
    };
    auto text = [](const rapidjson::Value& v) {
        rapidjson::StringBuffer b;
        rapidjson::Writer<rapidjson::StringBuffer> w(b);
        v.Accept(w);
        return std::string(b.GetString(), b.GetSize());
    };
    if (auto i = request.FindMember("instructions"); i != request.MemberEnd() && i->value.IsString())
        mix({i->value.GetString(), i->value.GetStringLength()});
    if (auto in = request.FindMember("input"); in != request.MemberEnd()) {
        if (in->value.IsString()) {
            mix({in->value.GetString(), in->value.GetStringLength()});
        } else if (in->value.IsArray()) {
            for (const auto& item : in->value.GetArray()) {
                auto role = item.IsObject() ? item.FindMember("role") : rapidjson::Value::ConstMemberIterator();
                if (item.IsObject() && role != item.MemberEnd() && role->value.IsString() && std::string_view(role->value.GetString()) == "user") {
                    mix(text(item));
                    break;
                }
            }
        }
    }
    char out[24];
    std::snprintf(out, sizeof out, "h:%016llx", static_cast<unsigned long long>(h));
    return out;
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
    rapidjson::StringBuffer buf;
    rapidjson::Writer<rapidjson::StringBuffer> w(buf);
    w.StartObject();
    w.Key("id");
    w.String(id.c_str(), static_cast<rapidjson::SizeType>(id.size()));
    w.Key("what");
    w.String(what);
    w.Key("body");
    if (json.empty()) w.Null();
    else w.RawValue(json.data(), json.size(), rapidjson::kObjectType);  // already JSON: the request or the response
    w.EndObject();
    const std::string line = std::string(buf.GetString(), buf.GetSize()) + "\n";
    ssize_t n = ::write(fd, line.data(), line.size());
    (void)n;
    ::close(fd);
}

}  // namespace pulse::gateway
