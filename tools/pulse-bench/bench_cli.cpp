// `pulse bench decode|accept|ttft|quality|drift`: measurements against any OpenAI-compatible
// server (and a Pulse gateway for the warmup cases). Definitions: docs/BENCHMARKS.md.
#include "pulse-bench/bench_cli.h"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/prettywriter.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "pulse-bench/client.h"
#include "pulse-bench/humaneval.h"
#include "pulse-bench/prometheus.h"
#include "pulse-bench/report.h"
#include "args/args.h"
#include "pulse-bench/agent.h"
#include "pulse-bench/sandbox.h"
#include "pulse-bench/stats.h"

namespace pulse::bench {
namespace fs = std::filesystem;
using Alloc = rapidjson::Document::AllocatorType;

const char* const kFooter = "exit codes: 0 ok, 1 some request or run failed, 2 usage\n";

namespace {

struct Usage : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Options {
    std::string tool;
    std::vector<Endpoint> arms;
    std::string model, api_key_env, out = "bench-results", prompts, metrics, restart_cmd, api = "chat", dataset, mode = "chat";
    std::string effort;  // decode --api responses: reasoning.effort ("" = none sent)
    std::string suite, kind = "all";  // agent: the task file, and which kinds run
    int max_turns = 0, seed = 1;
    std::string template_kwargs = R"({"enable_thinking":false})";
    std::vector<std::string> cases = {"cold", "warm"};
    std::vector<int> ks = {1};
    bool json = false, plot = true, interleave = false, ignore_eos = false;
    double timeout = 600, temperature = 0, exec_timeout = 10, ready_timeout = 900;
    int reps = -1, max_tokens = -1, samples = 1, limit = 0, prompt_words = 1500, cpu_s = 5;
};

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (c == sep) out.push_back(cur), cur.clear();
        else cur += c;
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}

// The command line: each tool a subcommand with the options it reads, then the checks that
// span options (or need the environment) once parsing is done.
struct CommandLine {
    Options o;
    std::vector<std::string> endpoints, arms;
    std::string ks = "1", cases = "cold,warm";
    std::vector<std::pair<std::string, CLI::App*>> tools;

    explicit CommandLine(CLI::App& bench) {
        auto tool = [&](const char* name, const char* about) {
            CLI::App* t = bench.add_subcommand(name, about);
            add_common(*t);
            tools.emplace_back(name, t);
            return t;
        };
        CLI::App* decode = tool("decode", "decode tok/s, TTFT and end-to-end time on fixed coding prompts (code_write, code_edit)");
        add_reps(*decode, 3);
        add_prompts(*decode);
        add_interleave(*decode);
        add_ignore_eos(*decode);
        add_api(*decode);
        add_effort(*decode);
        CLI::App* accept = tool("accept", "speculative-decoding acceptance from the server's /metrics deltas (or llama timings)");
        add_prompts(*accept);
        accept->add_option("--metrics", o.metrics, "the server's Prometheus /metrics (default: beside the endpoint)")->option_text("URL");
        add_api(*accept, " (responses: a Pulse gateway, whose own /metrics has its in-process decoder's counters)");
        CLI::App* ttft = tool("ttft", "time to first token: cold prefix cache, warm, first turn after a backend restart");
        add_reps(*ttft, 3);
        ttft->add_option("--cases", cases, "which of cold, warm, restart (default cold,warm)")->option_text("LIST");
        ttft->add_option("--restart-cmd", o.restart_cmd, "restarts the backend (the restart case)")->option_text("CMD");
        ttft->add_option("--ready-timeout", o.ready_timeout, "how long a restarted backend may take to answer (default 900)")
            ->option_text("S")
            ->check(CLI::Range(1.0, 86400.0));
        ttft->add_option("--prompt-words", o.prompt_words, "the prompt's length (default 1500)")->option_text("N")->check(CLI::Range(1, 1000000));
        add_api(*ttft);
        CLI::App* quality = tool("quality", "HumanEval pass@k, each completion run in a sandbox");
        quality->add_option("--dataset", o.dataset, "HumanEval .jsonl[.gz]")->option_text("PATH")->required();
        quality->add_option("--samples", o.samples, "completions per problem (default 1)")->option_text("N")->check(CLI::Range(1, 1000));
        quality->add_option("--k", ks, "the k of pass@k (default 1)")->option_text("1,10");
        add_limit(*quality);
        quality->add_option("--mode", o.mode, "chat or completions (default chat)")->option_text("chat|completions")->check(CLI::IsMember({"chat", "completions"}));
        add_sandbox(*quality);
        add_api(*quality);
        add_effort(*quality);
        CLI::App* drift = tool("drift", "A/B of two configurations: identical outputs, first divergence, speed ratio");
        add_prompts(*drift);
        add_ignore_eos(*drift);
        CLI::App* agent = tool("agent", "matched agent tasks (tool-calling scenarios, repository tasks) per arm, compared pair by pair");
        agent->add_option("--suite", o.suite, "the task file (default: the shipped suite)")->option_text("FILE");
        agent->add_option("--kind", o.kind, "which tasks (default all)")->option_text("tools|repo|smoke|all")->check(CLI::IsMember({"tools", "repo", "smoke", "all"}));
        add_limit(*agent);
        agent->add_option("--seed", o.seed, "the task order's seed (default 1)")->option_text("N")->check(CLI::Range(0, 1 << 30));
        agent->add_option("--max-turns", o.max_turns, "per task (default: the task's)")->option_text("N")->check(CLI::Range(1, 50));
        add_sandbox(*agent);
        add_api(*agent, " (responses for a Pulse gateway)");
        add_effort(*agent);
    }

    void add_common(CLI::App& t) {
        t.footer(kFooter);
        t.add_option("--endpoint", endpoints, "the server's OpenAI base URL, e.g. http://127.0.0.1:8888/v1")->option_text("[NAME=]URL");
        t.add_option("--arms", arms,
                     "two or more endpoints; URL#MODEL sets that arm's model (two models of one gateway)")
            ->option_text("A=URL,B=URL")
            ->delimiter(',');
        t.add_option("--model", o.model, "request model (default: the first /v1/models lists)")->option_text("M");
        t.add_option("--api-key-env", o.api_key_env, "read a bearer key from this environment variable")->option_text("VAR");
        t.add_option("--out", o.out, "where JSON and charts go (default bench-results)")->option_text("DIR");
        t.add_flag("--json", o.json, "print the result JSON on stdout; no progress, no table");
        t.add_flag("--no-plot", no_plot, "skip the chart");
        t.add_option("--timeout", o.timeout, "per request, seconds (default 600)")->option_text("S")->check(CLI::Range(0.1, 86400.0));
        t.add_option("--max-tokens", o.max_tokens, "per answer (default: the tool's)")->option_text("N")->check(CLI::Range(1, 1 << 20));
        t.add_option("--temperature", o.temperature, "sampling temperature (default 0)")->option_text("T")->check(CLI::Range(0.0, 10.0));
        t.add_option("--chat-template-kwargs", o.template_kwargs, "default {\"enable_thinking\": false}")->option_text("JSON");
    }
    void add_reps(CLI::App& t, int dflt) {
        t.add_option("--reps", o.reps, "repetitions (default " + std::to_string(dflt) + ")")->option_text("N")->check(CLI::Range(1, 10000));
    }
    void add_prompts(CLI::App& t) { t.add_option("--prompts", o.prompts, "the prompt file (default: the shipped one)")->option_text("FILE"); }
    void add_interleave(CLI::App& t) { t.add_flag("--interleave", o.interleave, "run the arms A B A B rather than A A B B"); }
    void add_ignore_eos(CLI::App& t) { t.add_flag("--ignore-eos", o.ignore_eos, "generate --max-tokens every time"); }
    void add_api(CLI::App& t, const std::string& note = " (responses: a Pulse gateway)") {
        t.add_option("--api", o.api, "chat or responses" + note)->option_text("chat|responses")->check(CLI::IsMember({"chat", "responses"}));
    }
    void add_effort(CLI::App& t) { t.add_option("--effort", o.effort, "--api responses: reasoning.effort (default: none sent)")->option_text("E"); }
    void add_limit(CLI::App& t) { t.add_option("--limit", o.limit, "at most N tasks")->option_text("N")->check(CLI::Range(1, 1000000)); }
    void add_sandbox(CLI::App& t) {
        t.add_option("--exec-timeout", o.exec_timeout, "per sandboxed run, seconds (default 10)")->option_text("S")->check(CLI::Range(0.1, 3600.0));
        t.add_option("--cpu-s", o.cpu_s, "CPU seconds per sandboxed run (default 5)")->option_text("S")->check(CLI::Range(1, 3600));
    }

    // The checks no single option can make. Throws Usage.
    void finish() {
        o.plot = !no_plot;
        o.cases = split(cases, ',');
        o.ks.clear();
        for (const auto& k : split(ks, ',')) o.ks.push_back(std::atoi(k.c_str()));
        std::vector<std::string> all = endpoints;
        all.insert(all.end(), arms.begin(), arms.end());
        for (size_t i = 0; i < all.size(); ++i) {
            try {
                o.arms.push_back(parse_endpoint(all[i], all.size() == 1 ? "endpoint" : std::string(1, static_cast<char>('a' + i))));
            } catch (const std::invalid_argument& e) {
                throw Usage(e.what());
            }
        }
        if (o.arms.empty()) throw Usage("--endpoint URL (or --arms A=URL,B=URL) is required");
        const char* key = o.api_key_env.empty() ? nullptr : std::getenv(o.api_key_env.c_str());
        if (!o.api_key_env.empty() && !key) throw Usage("--api-key-env " + o.api_key_env + ": the variable is not set");
        for (auto& e : o.arms) {
            if (!o.model.empty()) e.model = o.model;
            if (key) e.api_key = key;
        }
        rapidjson::Document kw;
        kw.Parse(o.template_kwargs.c_str());
        if (kw.HasParseError() || !kw.IsObject()) throw Usage("--chat-template-kwargs must be a JSON object");
        for (const auto& c : o.cases)
            if (c != "cold" && c != "warm" && c != "restart") throw Usage("--cases: '" + c + "' is not one of cold, warm, restart");
        for (int k : o.ks)
            if (k < 1 || k > o.samples) throw Usage("--k " + std::to_string(k) + " needs 1 <= k <= --samples (" + std::to_string(o.samples) + ")");
    }

    bool no_plot = false;
};

fs::path data_dir() {
    for (const char* d : {PULSE_BENCH_DATA_DIR, PULSE_BENCH_SOURCE_DATA_DIR})
        if (fs::exists(d)) return d;
    return PULSE_BENCH_DATA_DIR;
}

struct Prompt {
    std::string id, kind, system, user;
};

std::vector<Prompt> load_prompts(const std::string& file) {
    std::ifstream in(file);
    if (!in) throw Usage("cannot read the prompt file " + file);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    rapidjson::Document d;
    d.Parse(text.c_str());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("prompts") || !d["prompts"].IsArray())
        throw Usage(file + ": expected {\"prompts\": [{\"id\", \"kind\", \"system\", \"user\"}, ...]}");
    std::vector<Prompt> out;
    for (const auto& p : d["prompts"].GetArray()) {
        auto s = [&](const char* k) { return p.IsObject() && p.HasMember(k) && p[k].IsString() ? std::string(p[k].GetString()) : std::string(); };
        if (s("id").empty() || s("user").empty()) throw Usage(file + ": every prompt needs \"id\" and \"user\"");
        out.push_back({s("id"), s("kind").empty() ? s("id") : s("kind"), s("system"), s("user")});
    }
    if (out.empty()) throw Usage(file + ": no prompts");
    return out;
}

rapidjson::Value sv(const std::string& s, Alloc& a) { return rapidjson::Value(s.c_str(), static_cast<rapidjson::SizeType>(s.size()), a); }

rapidjson::Document chat_body(const Options& o, const Prompt& p, int max_tokens) {
    rapidjson::Document b(rapidjson::kObjectType);
    auto& a = b.GetAllocator();
    rapidjson::Value msgs(rapidjson::kArrayType);
    if (!p.system.empty()) {
        rapidjson::Value m(rapidjson::kObjectType);
        m.AddMember("role", "system", a).AddMember("content", sv(p.system, a), a);
        msgs.PushBack(m, a);
    }
    rapidjson::Value m(rapidjson::kObjectType);
    m.AddMember("role", "user", a).AddMember("content", sv(p.user, a), a);
    msgs.PushBack(m, a);
    b.AddMember("messages", msgs, a);
    b.AddMember("temperature", o.temperature, a);
    b.AddMember("max_tokens", max_tokens, a);
    if (o.ignore_eos) b.AddMember("ignore_eos", true, a);
    rapidjson::Document kw;
    kw.Parse(o.template_kwargs.c_str());
    if (kw.MemberCount() > 0) b.AddMember("chat_template_kwargs", rapidjson::Value(kw, a), a);
    return b;
}

// The same prompt as a Responses request (a Pulse gateway: its policies act on these).
rapidjson::Document responses_body(const Options& o, const Prompt& p, int max_tokens) {
    rapidjson::Document b(rapidjson::kObjectType);
    auto& a = b.GetAllocator();
    if (!p.system.empty()) b.AddMember("instructions", sv(p.system, a), a);
    b.AddMember("input", sv(p.user, a), a);
    b.AddMember("store", false, a).AddMember("temperature", o.temperature, a).AddMember("max_output_tokens", max_tokens, a);
    if (!o.effort.empty()) {
        rapidjson::Value r(rapidjson::kObjectType);
        r.AddMember("effort", sv(o.effort, a), a);
        b.AddMember("reasoning", r, a);
    }
    return b;
}

// The conditions every result carries.
rapidjson::Document start_doc(const Options& o, const std::vector<BackendInfo>& infos, int max_tokens, int reps) {
    rapidjson::Document d(rapidjson::kObjectType);
    auto& a = d.GetAllocator();
    d.AddMember("tool", sv(o.tool, a), a);
    rapidjson::Value c(rapidjson::kObjectType);
    c.AddMember("date", sv(now_iso(), a), a);
    c.AddMember("pulse_revision", sv(git_revision(), a), a);
    rapidjson::Value eps(rapidjson::kArrayType);
    for (size_t i = 0; i < o.arms.size(); ++i) eps.PushBack(endpoint_json(o.arms[i], infos[i], a), a);
    c.AddMember("endpoints", eps, a);
    rapidjson::Value sampler(rapidjson::kObjectType);
    sampler.AddMember("temperature", o.temperature, a);
    sampler.AddMember("max_tokens", max_tokens, a);
    sampler.AddMember("ignore_eos", o.ignore_eos, a);
    c.AddMember("sampler", sampler, a);
    rapidjson::Document kw;
    kw.Parse(o.template_kwargs.c_str());
    c.AddMember("chat_template_kwargs", rapidjson::Value(kw, a), a);
    c.AddMember("reps", reps, a);
    c.AddMember("interleave", o.interleave, a);
    c.AddMember("timeout_s", o.timeout, a);
    d.AddMember("conditions", c, a);
    return d;
}

std::vector<BackendInfo> probe_all(Options& o) {
    std::vector<BackendInfo> infos;
    for (auto& e : o.arms) {
        BackendInfo info = probe_backend(e);
        if (e.model.empty()) {
            if (info.model.empty()) throw std::runtime_error(e.base + "/models lists no model (is the server up?); pass --model");
            e.model = info.model;
        }
        infos.push_back(info);
    }
    return infos;
}

// The name every file of this run starts with: the tool, when the run started, and the process,
// so one run's files share it (a quality run's samples and its JSON) and two runs never do.
std::string stem(const Options& o) {
    static const std::string s = [&] {
        std::string t = now_iso();
        t.erase(std::remove(t.begin(), t.end(), ':'), t.end());
        return o.tool + "-" + t + "-" + std::to_string(::getpid());
    }();
    return s;
}

int finish(const Options& o, rapidjson::Document& doc, const Chart& chart, const std::string& text, bool any_failed) {
    auto wrote = write_outputs(o.out, stem(o), doc, o.plot ? &chart : nullptr);
    if (o.json) {
        rapidjson::StringBuffer b;
        rapidjson::PrettyWriter<rapidjson::StringBuffer> w(b);
        doc.Accept(w);
        std::printf("%s\n", b.GetString());
    } else {
        std::printf("%s", text.c_str());
        for (const auto& l : wrote) std::printf("%s\n", l.c_str());
    }
    return any_failed ? 1 : 0;
}

struct RunRecord {
    std::string arm, prompt, kind;
    int rep = 0;
    StreamResult r;
};

rapidjson::Value run_json(const RunRecord& x, Alloc& a) {
    rapidjson::Value v(rapidjson::kObjectType);
    v.AddMember("arm", sv(x.arm, a), a).AddMember("prompt", sv(x.prompt, a), a).AddMember("kind", sv(x.kind, a), a);
    v.AddMember("rep", x.rep, a).AddMember("ok", x.r.ok, a);
    if (!x.r.ok) v.AddMember("error", sv(x.r.error, a), a);
    v.AddMember("ttft_s", x.r.ttft, a).AddMember("e2e_s", x.r.end, a).AddMember("decode_tps", x.r.decode_tps(), a);
    v.AddMember("completion_tokens", x.r.completion_tokens, a).AddMember("prompt_tokens", x.r.prompt_tokens, a);
    v.AddMember("reasoning_tokens", x.r.reasoning_tokens, a);
    v.AddMember("cached_tokens", x.r.cached_tokens, a).AddMember("output_chunks", x.r.output_chunks, a);
    v.AddMember("finish_reason", sv(x.r.finish_reason, a), a);
    return v;
}

std::string mean_sd(const Summary& s, int dec = 1) { return num(s.mean, dec) + " ± " + num(s.stdev, dec); }

// ---- decode -------------------------------------------------------------------------------------

int decode(Options& o) {
    int reps = o.reps > 0 ? o.reps : 3, max_tokens = o.max_tokens > 0 ? o.max_tokens : 600;
    auto prompts = load_prompts(o.prompts.empty() ? (data_dir() / "decode_prompts.json").string() : o.prompts);
    auto infos = probe_all(o);
    // The order of runs: A B A B ... per (rep, prompt) with --interleave, else arm by arm.
    std::vector<std::tuple<size_t, size_t, int>> order;  // arm, prompt, rep
    if (o.interleave || o.arms.size() == 1)
        for (int r = 0; r < reps; ++r)
            for (size_t p = 0; p < prompts.size(); ++p)
                for (size_t a = 0; a < o.arms.size(); ++a) order.emplace_back(a, p, r);
    else
        for (size_t a = 0; a < o.arms.size(); ++a)
            for (int r = 0; r < reps; ++r)
                for (size_t p = 0; p < prompts.size(); ++p) order.emplace_back(a, p, r);
    Progress progress(order.size(), o.json);
    std::vector<RunRecord> runs;
    bool failed = false;
    for (auto [a, p, r] : order) {
        progress.step(prompts[p].id + " rep " + std::to_string(r + 1) + " on " + o.arms[a].name);
        RunRecord x{o.arms[a].name, prompts[p].id, prompts[p].kind, r,
                    o.api == "responses" ? stream_responses(o.arms[a], responses_body(o, prompts[p], max_tokens), o.timeout)
                                         : stream_chat(o.arms[a], chat_body(o, prompts[p], max_tokens), o.timeout)};
        if (x.r.ok && x.r.completion_tokens < 0) x.r.completion_tokens = x.r.output_chunks;  // no usage: chunks (flagged below)
        failed = failed || !x.r.ok;
        if (!x.r.ok && !o.json) std::fprintf(stderr, "  failed: %s\n", x.r.error.c_str());
        runs.push_back(std::move(x));
    }
    auto doc = start_doc(o, infos, max_tokens, reps);
    auto& al = doc.GetAllocator();
    doc["conditions"].AddMember("prompts", sv(o.prompts.empty() ? "decode_prompts.json (shipped)" : o.prompts, al), al);
    doc["conditions"].AddMember("api", sv(o.api, al), al).AddMember("effort", sv(o.effort, al), al);
    rapidjson::Value jr(rapidjson::kArrayType);
    for (const auto& x : runs) jr.PushBack(run_json(x, al), al);
    doc.AddMember("runs", jr, al);

    std::vector<std::string> kinds;
    for (const auto& p : prompts)
        if (std::find(kinds.begin(), kinds.end(), p.kind) == kinds.end()) kinds.push_back(p.kind);
    rapidjson::Value summ(rapidjson::kArrayType);
    std::vector<std::vector<std::string>> rows;
    Chart chart{"decode tok/s (mean, error bar = stdev)", "tokens/s", kinds, {}};
    for (const auto& arm : o.arms) {
        Chart::Series series{arm.name, {}, {}};
        for (const auto& k : kinds) {
            std::vector<double> tps, ttft, e2e, out, reasoning;
            for (const auto& x : runs)
                if (x.arm == arm.name && x.kind == k && x.r.ok) {
                    tps.push_back(x.r.decode_tps()), ttft.push_back(x.r.ttft), e2e.push_back(x.r.end);
                    out.push_back(static_cast<double>(x.r.completion_tokens));
                    if (x.r.reasoning_tokens >= 0) reasoning.push_back(static_cast<double>(x.r.reasoning_tokens));
                }
            Summary st = summarize(tps), tt = summarize(ttft), ee = summarize(e2e), ot = summarize(out), rt = summarize(reasoning);
            rapidjson::Value s(rapidjson::kObjectType);
            s.AddMember("arm", sv(arm.name, al), al).AddMember("kind", sv(k, al), al);
            s.AddMember("decode_tps", summary_json(st, al), al).AddMember("ttft_s", summary_json(tt, al), al).AddMember("e2e_s", summary_json(ee, al), al);
            s.AddMember("output_tokens", summary_json(ot, al), al).AddMember("reasoning_tokens", summary_json(rt, al), al);
            summ.PushBack(s, al);
            rows.push_back({arm.name, k, std::to_string(st.n), mean_sd(st), num(st.median), num(tt.median, 3), num(ee.median, 2),
                            num(ot.median, 0), rt.n ? num(rt.median, 0) : "-", std::to_string(st.outliers.size())});
            series.values.push_back(st.mean);
            series.errors.push_back(st.stdev);
        }
        chart.series.push_back(series);
    }
    doc.AddMember("summary", summ, al);
    std::string text = table({"ARM", "KIND", "N", "DECODE tok/s", "MEDIAN", "TTFT s", "E2E s", "OUT tok", "REASONING tok", "OUTLIERS"}, rows);
    // Pair by pair ratios against the first arm (absolute numbers drift; ratios in one run do not).
    if (o.arms.size() > 1) {
        rapidjson::Value pairs(rapidjson::kArrayType);
        std::vector<std::vector<std::string>> prow;
        for (size_t b = 1; b < o.arms.size(); ++b) {
            // Ratios of the same prompt and rep on both arms: decode speed, time, output tokens.
            std::vector<double> ratios, e2e, tokens;
            for (const auto& x : runs) {
                if (x.arm != o.arms[0].name || !x.r.ok) continue;
                for (const auto& y : runs) {
                    if (y.arm != o.arms[b].name || y.prompt != x.prompt || y.rep != x.rep || !y.r.ok) continue;
                    if (x.r.decode_tps() > 0) ratios.push_back(y.r.decode_tps() / x.r.decode_tps());
                    if (x.r.end > 0) e2e.push_back(y.r.end / x.r.end);
                    if (x.r.completion_tokens > 0) tokens.push_back(static_cast<double>(y.r.completion_tokens) / static_cast<double>(x.r.completion_tokens));
                }
            }
            Summary rs = summarize(ratios), es = summarize(e2e), ts = summarize(tokens);
            rapidjson::Value pr(rapidjson::kObjectType);
            pr.AddMember("arm", sv(o.arms[b].name, al), al).AddMember("baseline", sv(o.arms[0].name, al), al);
            pr.AddMember("decode_tps_ratio", summary_json(rs, al), al).AddMember("e2e_ratio", summary_json(es, al), al);
            pr.AddMember("output_tokens_ratio", summary_json(ts, al), al);
            pairs.PushBack(pr, al);
            const std::string name = o.arms[b].name + " / " + o.arms[0].name;
            prow.push_back({name, "decode tok/s", std::to_string(rs.n), num(rs.median, 3), num(rs.mean, 3), num(rs.min, 3), num(rs.max, 3)});
            prow.push_back({name, "e2e time", std::to_string(es.n), num(es.median, 3), num(es.mean, 3), num(es.min, 3), num(es.max, 3)});
            prow.push_back({name, "output tokens", std::to_string(ts.n), num(ts.median, 3), num(ts.mean, 3), num(ts.min, 3), num(ts.max, 3)});
        }
        doc.AddMember("pairs", pairs, al);
        text += "\n" + table({"RATIO (pair by pair)", "OF", "PAIRS", "MEDIAN", "MEAN", "MIN", "MAX"}, prow);
    }
    return finish(o, doc, chart, text, failed);
}

// ---- accept ------------------------------------------------------------------------------------------

int accept(Options& o) {
    int max_tokens = o.max_tokens > 0 ? o.max_tokens : 256;
    auto prompts = load_prompts(o.prompts.empty() ? (data_dir() / "accept_prompts.json").string() : o.prompts);
    auto infos = probe_all(o);
    const Endpoint& ep = o.arms[0];
    std::string murl = o.metrics.empty() ? ep.root() + "/metrics" : o.metrics;
    HttpReply before = http_get(murl, 30, ep.api_key);
    Progress progress(prompts.size(), o.json);
    std::vector<RunRecord> runs;
    bool failed = false;
    int64_t t_draft = 0, t_acc = 0;
    bool have_timings = false;
    for (const auto& p : prompts) {
        progress.step(p.id);
        RunRecord x{ep.name, p.id, p.kind, 0,
                    o.api == "responses" ? stream_responses(ep, responses_body(o, p, max_tokens), o.timeout)
                                         : stream_chat(ep, chat_body(o, p, max_tokens), o.timeout)};
        failed = failed || !x.r.ok;
        if (x.r.draft_n >= 0) have_timings = true, t_draft += x.r.draft_n, t_acc += std::max<int64_t>(0, x.r.draft_accepted);
        runs.push_back(std::move(x));
    }
    HttpReply after = http_get(murl, 30, ep.api_key);
    SpecCounters b = parse_spec_counters(before.status == 200 ? before.body : ""), e = parse_spec_counters(after.status == 200 ? after.body : "");
    auto doc = start_doc(o, infos, max_tokens, 1);
    auto& al = doc.GetAllocator();
    doc["conditions"].AddMember("metrics_url", sv(murl, al), al);
    doc["conditions"].AddMember("prompts", sv(o.prompts.empty() ? "accept_prompts.json (shipped, 40 held-out prompts)" : o.prompts, al), al);
    rapidjson::Value res(rapidjson::kObjectType);
    std::string text;
    Chart chart{"draft acceptance by position", "acceptance rate", {}, {{"accepted / drafts", {}, {}}}};
    if (e.found) {
        double drafts = e.drafts - b.drafts, dt = e.draft_tokens - b.draft_tokens, acc = e.accepted - b.accepted;
        res.AddMember("source", sv(e.prefix + "spec_decode_* counters (deltas)", al), al);
        res.AddMember("drafts", drafts, al).AddMember("draft_tokens", dt, al).AddMember("accepted_tokens", acc, al);
        double rate = dt > 0 ? acc / dt : 0, mean_len = drafts > 0 ? 1 + acc / drafts : 0;
        res.AddMember("acceptance_rate", rate, al).AddMember("mean_tokens_per_step", mean_len, al);
        rapidjson::Value pp(rapidjson::kArrayType);
        std::vector<std::vector<std::string>> rows;
        for (const auto& [pos, v] : e.per_pos) {
            double d = v - (b.per_pos.count(pos) ? b.per_pos.at(pos) : 0);
            double r = drafts > 0 ? d / drafts : 0;
            rapidjson::Value x(rapidjson::kObjectType);
            x.AddMember("position", pos, al).AddMember("accepted", d, al).AddMember("rate", r, al);
            pp.PushBack(x, al);
            rows.push_back({std::to_string(pos), num(d, 0), num(r, 3)});
            chart.categories.push_back(std::to_string(pos));
            chart.series[0].values.push_back(r);
        }
        res.AddMember("per_position", pp, al);
        text = "acceptance rate " + num(rate, 3) + " (" + num(acc, 0) + " of " + num(dt, 0) + " draft tokens), mean tokens per step " +
               num(mean_len, 2) + " over " + num(drafts, 0) + " drafts\n" + table({"POSITION", "ACCEPTED", "RATE"}, rows);
        if (drafts <= 0) text += "no drafts during the run: is speculative decoding on?\n";
    } else if (have_timings) {
        res.AddMember("source", "llama-server timings (draft_n, draft_n_accepted)", al);
        res.AddMember("draft_tokens", t_draft, al).AddMember("accepted_tokens", t_acc, al);
        double rate = t_draft > 0 ? static_cast<double>(t_acc) / static_cast<double>(t_draft) : 0;
        res.AddMember("acceptance_rate", rate, al);
        text = "acceptance rate " + num(rate, 3) + " (" + std::to_string(t_acc) + " of " + std::to_string(t_draft) +
               " draft tokens, from response timings; per-position rates need --metrics)\n";
    } else {
        res.AddMember("source", "none", al);
        text = "no speculative-decoding counters at " + murl + " (HTTP " + std::to_string(after.status) +
               ") and no draft timings in the responses: nothing to report\n";
        failed = true;
    }
    doc.AddMember("acceptance", res, al);
    rapidjson::Value jr(rapidjson::kArrayType);
    for (const auto& x : runs) jr.PushBack(run_json(x, al), al);
    doc.AddMember("runs", jr, al);
    return finish(o, doc, chart, text, failed);
}

// ---- ttft ----------------------------------------------------------------------------------------------

std::string filler(int words) {
    static const char* const vocab[] = {"the", "gateway", "streams", "tokens", "from", "a", "backend", "that", "serves", "requests",
                                        "with", "prefix", "cache", "blocks", "and", "speculative", "drafts", "for", "coding", "agents"};
    std::mt19937 rng(1234);
    std::string s;
    for (int i = 0; i < words; ++i) s += std::string(i ? " " : "") + vocab[rng() % 20];
    return s;
}

int ttft(Options& o) {
    int reps = o.reps > 0 ? o.reps : 3, max_tokens = o.max_tokens > 0 ? o.max_tokens : 16;
    bool wants_restart = std::find(o.cases.begin(), o.cases.end(), "restart") != o.cases.end();
    if (wants_restart && o.restart_cmd.empty()) throw Usage("the restart case needs --restart-cmd CMD (it restarts the backend)");
    auto infos = probe_all(o);
    Endpoint ep = o.arms[0];
    const std::string context = "Project notes for the assistant.\n" + filler(o.prompt_words);
    auto send = [&](const std::string& prefix, const std::string& key) {
        Prompt p{"ttft", "ttft", prefix + context, "In one word: what streams tokens?"};
        if (o.api == "chat") return stream_chat(ep, chat_body(o, p, max_tokens), o.timeout);
        rapidjson::Document b(rapidjson::kObjectType);
        auto& a = b.GetAllocator();
        b.AddMember("instructions", sv(p.system, a), a);
        b.AddMember("input", sv(p.user, a), a);
        b.AddMember("store", false, a).AddMember("max_output_tokens", max_tokens, a).AddMember("temperature", o.temperature, a);
        b.AddMember("prompt_cache_key", sv(key, a), a);
        return stream_responses(ep, std::move(b), o.timeout);
    };
    size_t total = 0;
    for (const auto& c : o.cases) total += c == "restart" ? 1 : static_cast<size_t>(reps) + (c == "warm");
    Progress progress(total, o.json);
    std::vector<RunRecord> runs;
    bool failed = false;
    std::string warmup_note;
    double warmups = -1;
    const std::string stable_key = "pulse-bench-ttft";
    for (const auto& c : o.cases) {
        if (c == "cold") {
            for (int r = 0; r < reps; ++r) {
                progress.step("cold rep " + std::to_string(r + 1));
                std::string nonce = "Session " + std::to_string(std::random_device{}()) + "-" + std::to_string(r) + ".\n";
                runs.push_back({ep.name, "cold", "cold", r, send(nonce, "pulse-bench-cold-" + nonce)});
            }
        } else if (c == "warm") {
            progress.step("warm: priming the cache (not measured)");
            StreamResult prime = send("", stable_key);
            failed = failed || !prime.ok;
            for (int r = 0; r < reps; ++r) {
                progress.step("warm rep " + std::to_string(r + 1));
                runs.push_back({ep.name, "warm", "warm", r, send("", stable_key)});
            }
        } else {  // restart
            progress.step("restart: priming, restarting the backend, waiting for it");
            StreamResult prime = send("", stable_key);
            failed = failed || !prime.ok;
            std::string gw_metrics = o.api == "responses" ? ep.root() + "/metrics" : "";
            auto warmup_count = [&]() -> double {
                if (gw_metrics.empty()) return -1;
                HttpReply m = http_get(gw_metrics, 10, ep.api_key);
                double sum = 0;
                std::istringstream in(m.body);
                for (std::string l; std::getline(in, l);)
                    if (l.rfind("pulse_warmup_requests_total", 0) == 0) sum += std::strtod(l.c_str() + l.rfind(' ') + 1, nullptr);
                return sum;
            };
            double w0 = warmup_count();
            int rc = std::system(o.restart_cmd.c_str());
            if (rc != 0) throw std::runtime_error("--restart-cmd exited with " + std::to_string(rc));
            // Ready: the endpoint (or the gateway's view of it) lists models with 200, then the
            // gateway's warmup requests stop increasing.
            auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.ready_timeout);
            while (true) {
                HttpReply h = http_get(o.api == "responses" ? ep.root() + "/health" : ep.base + "/models", 5, ep.api_key);
                if (h.status == 200) break;
                if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("the backend was not ready after the restart");
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
            }
            if (!gw_metrics.empty()) {
                // Settled: no new warmup request for 3 s. The gateway starts its replays only
                // after warmup.quiet_s (2 s by default) without real traffic.
                double last = warmup_count();
                for (int stable = 0, i = 0; stable < 15 && i < 600; ++i) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(200));
                    double now = warmup_count();
                    stable = now == last ? stable + 1 : 0;
                    last = now;
                }
                warmups = last - w0;
                warmup_note = "gateway warmup requests during the restart: " + num(warmups, 0);
            }
            runs.push_back({ep.name, "restart", "restart", 0, send("", stable_key)});
        }
    }
    auto doc = start_doc(o, infos, max_tokens, reps);
    auto& al = doc.GetAllocator();
    doc["conditions"].AddMember("api", sv(o.api, al), al).AddMember("prompt_words", o.prompt_words, al);
    doc["conditions"].AddMember("restart_cmd", sv(o.restart_cmd, al), al);
    if (warmups >= 0) doc.AddMember("gateway_warmup_requests", warmups, al);
    rapidjson::Value jr(rapidjson::kArrayType), summ(rapidjson::kArrayType);
    for (const auto& x : runs) jr.PushBack(run_json(x, al), al), failed = failed || !x.r.ok;
    doc.AddMember("runs", jr, al);
    std::vector<std::vector<std::string>> rows;
    Chart chart{"time to first token by case (median, error bar = stdev)", "seconds", {}, {{"ttft", {}, {}}}};
    for (const auto& c : o.cases) {
        std::vector<double> t, cached, prompt_tok;
        for (const auto& x : runs)
            if (x.prompt == c && x.r.ok) t.push_back(x.r.ttft), cached.push_back(static_cast<double>(x.r.cached_tokens)), prompt_tok.push_back(static_cast<double>(x.r.prompt_tokens));
        Summary s = summarize(t), cs = summarize(cached), ps = summarize(prompt_tok);
        rapidjson::Value v(rapidjson::kObjectType);
        v.AddMember("case", sv(c, al), al).AddMember("ttft_s", summary_json(s, al), al);
        v.AddMember("cached_tokens", summary_json(cs, al), al).AddMember("prompt_tokens", summary_json(ps, al), al);
        summ.PushBack(v, al);
        rows.push_back({c, std::to_string(s.n), num(s.median, 3), num(s.min, 3), num(s.max, 3), num(cs.median, 0), num(ps.median, 0)});
        chart.categories.push_back(c);
        chart.series[0].values.push_back(s.median);
        chart.series[0].errors.push_back(s.stdev);
    }
    doc.AddMember("summary", summ, al);
    std::string text = table({"CASE", "N", "TTFT s (median)", "MIN", "MAX", "CACHED TOKENS", "PROMPT TOKENS"}, rows);
    if (!warmup_note.empty()) text += warmup_note + "\n";
    return finish(o, doc, chart, text, failed);
}

// ---- quality ---------------------------------------------------------------------------------------------

int quality(Options& o) {
    if (o.dataset.empty()) throw Usage("quality needs --dataset PATH (HumanEval.jsonl or .jsonl.gz; nothing is downloaded)");
    if (o.mode == "completions" && o.api == "responses") throw Usage("quality --mode completions cannot use --api responses");
    std::vector<Problem> problems;
    try {
        problems = load_problems(o.dataset);
    } catch (const std::runtime_error& e) {
        throw Usage(e.what());
    }
    if (o.limit > 0 && static_cast<size_t>(o.limit) < problems.size()) problems.resize(static_cast<size_t>(o.limit));
    if (o.samples > 1 && o.temperature == 0 && !o.json)
        std::fprintf(stderr, "note: %d samples at temperature 0 are likely identical; pass --temperature for pass@k\n", o.samples);
    int max_tokens = o.max_tokens > 0 ? o.max_tokens : 1024;
    auto infos = probe_all(o);
    SandboxLimits limits;
    limits.wall_s = o.exec_timeout;
    limits.cpu_s = o.cpu_s;
    // Every arm answers every problem and sample, interleaved (problem by problem, arm by arm),
    // so that the arms differ only in what is compared.
    Progress progress(problems.size() * static_cast<size_t>(o.samples) * o.arms.size(), o.json);
    struct Tally {
        std::map<std::string, int> counts = {{"passed", 0}, {"failed", 0}, {"timeout", 0}, {"crashed", 0}, {"error", 0}};
        std::vector<std::pair<int, int>> nc;  // per problem: samples, passed
        std::vector<double> tokens, seconds, reasoning;
        rapidjson::Value per{rapidjson::kArrayType};
    };
    std::vector<Tally> tally(o.arms.size());
    auto doc = start_doc(o, infos, max_tokens, 1);
    auto& al = doc.GetAllocator();
    fs::create_directories(o.out);
    fs::path samples_path = fs::path(o.out) / (stem(o) + "-samples.jsonl");
    std::ofstream samples(samples_path);
    bool sandbox_broken = false;
    for (const auto& pb : problems) {
        std::vector<int> passed(o.arms.size(), 0);
        std::vector<rapidjson::Value> outs;
        for (size_t a = 0; a < o.arms.size(); ++a) outs.emplace_back(rapidjson::kArrayType);
        for (int s = 0; s < o.samples; ++s) {
            for (size_t ai = 0; ai < o.arms.size(); ++ai) {
                const Endpoint& ep = o.arms[ai];
                progress.step(pb.task_id + (o.samples > 1 ? " sample " + std::to_string(s + 1) : "") + (o.arms.size() > 1 ? " on " + ep.name : ""));
                std::string completion, outcome, detail;
                if (o.mode == "chat") {
                    Prompt p{pb.task_id, "humaneval", "You are a careful Python programmer.", chat_prompt(pb)};
                    StreamResult r = o.api == "responses" ? stream_responses(ep, responses_body(o, p, max_tokens), o.timeout)
                                                          : stream_chat(ep, chat_body(o, p, max_tokens), o.timeout);
                    if (r.ok) {
                        completion = completion_from_chat(pb, r.text);
                        if (r.completion_tokens >= 0) tally[ai].tokens.push_back(static_cast<double>(r.completion_tokens));
                        if (r.reasoning_tokens >= 0) tally[ai].reasoning.push_back(static_cast<double>(r.reasoning_tokens));
                        tally[ai].seconds.push_back(r.end);
                    } else {
                        outcome = "error", detail = "request: " + r.error;
                    }
                } else {
                    rapidjson::Document b(rapidjson::kObjectType);
                    auto& a = b.GetAllocator();
                    b.AddMember("model", sv(ep.model, a), a).AddMember("prompt", sv(pb.prompt, a), a);
                    b.AddMember("max_tokens", max_tokens, a).AddMember("temperature", o.temperature, a);
                    rapidjson::StringBuffer sb;
                    rapidjson::Writer<rapidjson::StringBuffer> w(sb);
                    b.Accept(w);
                    HttpReply h = http_post(ep.base + "/completions", sb.GetString(), o.timeout, ep.api_key);
                    rapidjson::Document d;
                    d.Parse(h.body.c_str());
                    if (h.status == 200 && d.IsObject() && d.HasMember("choices") && d["choices"].IsArray() && !d["choices"].Empty() &&
                        d["choices"][0].HasMember("text") && d["choices"][0]["text"].IsString())
                        completion = completion_from_raw(d["choices"][0]["text"].GetString());
                    else outcome = "error", detail = "request: HTTP " + std::to_string(h.status) + " " + (h.error.empty() ? h.body.substr(0, 200) : h.error);
                }
                if (outcome.empty()) {
                    SandboxResult sr = run_python_sandboxed(program_for(pb, completion), limits);
                    outcome = outcome_name(sr.outcome);
                    detail = sr.detail.empty() && sr.outcome == Outcome::failed ? sr.output.substr(sr.output.size() > 400 ? sr.output.size() - 400 : 0) : sr.detail;
                    if (sr.outcome == Outcome::error) sandbox_broken = true;
                }
                if (outcome == "passed") ++passed[ai];
                ++tally[ai].counts[outcome];
                rapidjson::Value x(rapidjson::kObjectType);
                x.AddMember("outcome", sv(outcome, al), al).AddMember("detail", sv(detail, al), al);
                outs[ai].PushBack(x, al);
                rapidjson::Document line(rapidjson::kObjectType);
                auto& la = line.GetAllocator();
                line.AddMember("arm", sv(ep.name, la), la).AddMember("task_id", sv(pb.task_id, la), la);
                line.AddMember("completion", sv(completion, la), la).AddMember("outcome", sv(outcome, la), la);
                rapidjson::StringBuffer sb;
                rapidjson::Writer<rapidjson::StringBuffer> w(sb);
                line.Accept(w);
                samples << sb.GetString() << "\n";
                if (!o.json && outcome != "passed")
                    std::fprintf(stderr, "  %s%s: %s %s\n", pb.task_id.c_str(), o.arms.size() > 1 ? (" on " + ep.name).c_str() : "", outcome.c_str(),
                                 detail.substr(0, 160).c_str());
            }
        }
        for (size_t ai = 0; ai < o.arms.size(); ++ai) {
            tally[ai].nc.emplace_back(o.samples, passed[ai]);
            rapidjson::Value pv(rapidjson::kObjectType);
            pv.AddMember("task_id", sv(pb.task_id, al), al).AddMember("passed", passed[ai], al).AddMember("samples", outs[ai], al);
            tally[ai].per.PushBack(pv, al);
        }
    }
    doc["conditions"].AddMember("dataset", sv(o.dataset, al), al).AddMember("problems", static_cast<uint64_t>(problems.size()), al);
    doc["conditions"].AddMember("samples_per_problem", o.samples, al).AddMember("mode", sv(o.mode, al), al);
    doc["conditions"].AddMember("api", sv(o.api, al), al).AddMember("effort", sv(o.effort, al), al);
    doc["conditions"].AddMember("exec_wall_timeout_s", o.exec_timeout, al).AddMember("exec_cpu_s", o.cpu_s, al);
    std::string text;
    Chart chart{"HumanEval pass@k", "pass@k", {}, {}};
    for (int k : o.ks) chart.categories.push_back("pass@" + std::to_string(k));
    auto arm_result = [&](size_t ai, rapidjson::Value& into) {
        Tally& t = tally[ai];
        rapidjson::Value pk(rapidjson::kObjectType), cj(rapidjson::kObjectType);
        Chart::Series series{o.arms[ai].name, {}, {}};
        for (int k : o.ks) {
            double sum = 0;
            for (auto [n, c] : t.nc) sum += pass_at_k(n, c, k);
            double v = t.nc.empty() ? 0 : sum / static_cast<double>(t.nc.size());
            pk.AddMember(sv("pass@" + std::to_string(k), al), rapidjson::Value(v), al);
            text += (o.arms.size() > 1 ? o.arms[ai].name + ": " : std::string()) + "pass@" + std::to_string(k) + " = " + num(v, 4) + " over " +
                    std::to_string(t.nc.size()) + " problems\n";
            series.values.push_back(v);
        }
        chart.series.push_back(series);
        std::vector<std::vector<std::string>> rows;
        for (const char* k : {"passed", "failed", "timeout", "crashed", "error"}) {
            cj.AddMember(rapidjson::Value(k, al), rapidjson::Value(t.counts[k]), al);
            rows.push_back({k, std::to_string(t.counts[k])});
        }
        into.AddMember("pass_at_k", pk, al).AddMember("outcomes", cj, al);
        into.AddMember("output_tokens", summary_json(summarize(t.tokens), al), al).AddMember("e2e_s", summary_json(summarize(t.seconds), al), al);
        into.AddMember("reasoning_tokens", summary_json(summarize(t.reasoning), al), al).AddMember("problems", t.per, al);
        if (o.arms.size() == 1) text += table({"OUTCOME", "SAMPLES"}, rows);
    };
    if (o.arms.size() == 1) {
        arm_result(0, doc);
    } else {
        rapidjson::Value arms(rapidjson::kArrayType);
        std::vector<std::vector<std::string>> rows;
        for (size_t ai = 0; ai < o.arms.size(); ++ai) {
            rapidjson::Value v(rapidjson::kObjectType);
            v.AddMember("arm", sv(o.arms[ai].name, al), al);
            arm_result(ai, v);
            Summary tk = summarize(tally[ai].tokens), sc = summarize(tally[ai].seconds), rs = summarize(tally[ai].reasoning);
            rows.push_back({o.arms[ai].name, std::to_string(tally[ai].counts["passed"]), std::to_string(tally[ai].counts["failed"]),
                            std::to_string(tally[ai].counts["timeout"] + tally[ai].counts["crashed"] + tally[ai].counts["error"]), num(tk.median, 0),
                            rs.n ? num(rs.median, 0) : "-", num(sc.median, 2)});
            arms.PushBack(v, al);
        }
        doc.AddMember("arms", arms, al);
        text += table({"ARM", "PASSED", "FAILED", "OTHER", "OUT tok (median)", "REASONING tok", "E2E s"}, rows);
    }
    doc.AddMember("samples_file", sv(samples_path.string(), al), al);
    text += "samples: " + samples_path.string() + "\n";
    if (sandbox_broken) text += "WARNING: the sandbox could not be set up for some samples (outcome 'error'); see the JSON\n";
    int errors = 0;
    for (auto& t : tally) errors += t.counts["error"];
    return finish(o, doc, chart, text, errors > 0);
}

// ---- agent -------------------------------------------------------------------------------------------------

constexpr int kAgentMaxTokens = 8192;

int agent_bench(Options& o) {
    if (o.kind != "tools" && o.kind != "repo" && o.kind != "all" && o.kind != "smoke") throw Usage("--kind must be tools, repo, smoke or all");
    const std::string suite_path = o.suite.empty() ? (data_dir() / "agent_tasks.json").string() : o.suite;
    std::vector<agent::Task> tasks;
    {
        std::ifstream in(suite_path);
        if (!in) throw Usage("cannot read the agent suite " + suite_path);
        try {
            tasks = agent::load_suite(std::string(std::istreambuf_iterator<char>(in), {}), suite_path);
        } catch (const std::runtime_error& e) {
            throw Usage(e.what());
        }
    }
    std::erase_if(tasks, [&](const agent::Task& t) { return o.kind == "smoke" ? !t.smoke : o.kind != "all" && t.kind != o.kind; });
    if (o.limit > 0 && static_cast<size_t>(o.limit) < tasks.size()) tasks.resize(static_cast<size_t>(o.limit));
    if (tasks.empty()) throw Usage("no task of kind " + o.kind + " in " + suite_path);
    for (auto& t : tasks)
        if (o.max_turns > 0) t.max_turns = o.max_turns;
    // The cap on each answer, reasoning included: high enough that a realistic reasoning budget
    // (a policy's, the backend's), not the cap, decides how long a model thinks. Answers cut at
    // the cap are counted per arm and warned about.
    const int max_tokens = o.max_tokens > 0 ? o.max_tokens : kAgentMaxTokens;
    auto infos = probe_all(o);
    SandboxLimits limits;
    limits.wall_s = o.exec_timeout;
    limits.cpu_s = o.cpu_s;
    // Matched: task by task, every arm in turn, the task's seed the same on each.
    Progress progress(tasks.size() * o.arms.size(), o.json);
    std::vector<std::vector<agent::Result>> results(o.arms.size());
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
        for (size_t ai = 0; ai < o.arms.size(); ++ai) {
            progress.step(tasks[ti].id + " on " + o.arms[ai].name);
            agent::Sampler sm{o.temperature, o.seed + static_cast<int64_t>(ti), max_tokens, o.effort};
            const Endpoint& ep = o.arms[ai];
            agent::Ask ask = [&](const agent::Conversation& c) {
                return o.api == "responses" ? agent::ask_responses(ep, c, sm, o.timeout) : agent::ask_chat(ep, c, sm, o.timeout);
            };
            results[ai].push_back(agent::run_task(tasks[ti], ask, limits));
            const auto& r = results[ai].back();
            if (!o.json && r.outcome != "pass") std::fprintf(stderr, "  %s on %s: %s (%s)\n", tasks[ti].id.c_str(), ep.name.c_str(), r.outcome.c_str(), r.detail.c_str());
        }
    }
    auto doc = start_doc(o, infos, max_tokens, 1);
    auto& al = doc.GetAllocator();
    doc["conditions"].AddMember("suite", sv(o.suite.empty() ? "agent_tasks.json (shipped)" : o.suite, al), al);
    doc["conditions"].AddMember("kind", sv(o.kind, al), al).AddMember("tasks", static_cast<uint64_t>(tasks.size()), al);
    doc["conditions"].AddMember("api", sv(o.api, al), al).AddMember("effort", sv(o.effort, al), al);
    doc["conditions"].AddMember("seed", o.seed, al).AddMember("order", "task by task, every arm in turn", al);
    rapidjson::Value runs(rapidjson::kArrayType), arms(rapidjson::kArrayType);
    std::vector<std::vector<std::string>> rows;
    Chart chart{"agent tasks by outcome", "tasks", {"pass", "partial", "fail", "error"}, {}};
    int errors = 0;
    std::string verdicts, cut_warnings;
    for (size_t ai = 0; ai < o.arms.size(); ++ai) {
        std::map<std::string, int> n = {{"pass", 0}, {"partial", 0}, {"fail", 0}, {"error", 0}};
        int unknown = 0, bad_args = 0, extra = 0, cut = 0;
        int64_t budget = -1;
        std::map<std::string, std::pair<int, int>> by_category;  // tasks, passed
        int64_t tin = 0, tout = 0;
        std::vector<double> secs;
        for (size_t ti = 0; ti < tasks.size(); ++ti) {
            const auto& r = results[ai][ti];
            ++n[r.outcome];
            unknown += r.unknown_tools, bad_args += r.bad_arguments, extra += r.extra_calls, cut += r.cut;
            budget = std::max(budget, r.budget);
            auto& cat = by_category[tasks[ti].category];
            cat.first += 1;
            cat.second += r.outcome == "pass" ? 1 : 0;
            tin += r.input_tokens, tout += r.output_tokens;
            secs.push_back(r.seconds);
            rapidjson::Value x(rapidjson::kObjectType);
            x.AddMember("arm", sv(o.arms[ai].name, al), al).AddMember("task", sv(tasks[ti].id, al), al).AddMember("kind", sv(tasks[ti].kind, al), al);
            x.AddMember("category", sv(tasks[ti].category, al), al);
            x.AddMember("outcome", sv(r.outcome, al), al).AddMember("detail", sv(r.detail, al), al);
            x.AddMember("turns", r.turns, al).AddMember("calls", r.calls, al).AddMember("matched_calls", r.matched, al);
            x.AddMember("extra_calls", r.extra_calls, al).AddMember("unknown_tools", r.unknown_tools, al).AddMember("bad_arguments", r.bad_arguments, al);
            x.AddMember("input_tokens", r.input_tokens, al).AddMember("output_tokens", r.output_tokens, al).AddMember("seconds", r.seconds, al);
            x.AddMember("answers_cut_at_max_tokens", r.cut, al);
            rapidjson::Value wr(rapidjson::kArrayType);
            for (const auto& w : r.wrong) wr.PushBack(sv(w, al), al);
            x.AddMember("wrong_calls", wr, al);
            rapidjson::Value tr(rapidjson::kArrayType);
            for (const auto& l : r.transcript) tr.PushBack(sv(l, al), al);
            x.AddMember("transcript", tr, al);
            runs.PushBack(x, al);
        }
        errors += n["error"];
        const double total = static_cast<double>(tasks.size());
        rapidjson::Value a(rapidjson::kObjectType);
        a.AddMember("arm", sv(o.arms[ai].name, al), al);
        for (const char* k : {"pass", "partial", "fail", "error"}) a.AddMember(rapidjson::Value(k, al), rapidjson::Value(n[k]), al);
        a.AddMember("pass_rate", n["pass"] / total, al).AddMember("input_tokens", tin, al).AddMember("output_tokens", tout, al);
        a.AddMember("seconds", summary_json(summarize(secs), al), al);
        rapidjson::Value te(rapidjson::kObjectType);
        te.AddMember("unknown_tools", unknown, al).AddMember("bad_arguments", bad_args, al).AddMember("extra_calls", extra, al);
        a.AddMember("tool_call_errors", te, al);
        a.AddMember("answers_cut_at_max_tokens", cut, al);
        if (budget >= 0) a.AddMember("reasoning_budget", budget, al);
        if (budget > max_tokens)
            cut_warnings += "warning: " + o.arms[ai].name + "'s reasoning budget (" + std::to_string(budget) + ", X-Pulse-Reasoning-Budget) exceeds --max-tokens " +
                            std::to_string(max_tokens) + ": the cap, not the budget, limits how long it thinks (raise --max-tokens)\n";
        rapidjson::Value cats(rapidjson::kObjectType);
        for (const auto& [name, tp] : by_category) {
            rapidjson::Value c(rapidjson::kObjectType);
            c.AddMember("tasks", tp.first, al).AddMember("pass", tp.second, al);
            cats.AddMember(sv(name, al), c, al);
        }
        a.AddMember("by_category", cats, al);
        if (cut > 0)
            cut_warnings += "warning: " + std::to_string(cut) + " answers of " + o.arms[ai].name + " were cut at --max-tokens " +
                            std::to_string(max_tokens) + ": the cap, not the arm's reasoning budget, decided how long it thought (raise --max-tokens)\n";
        arms.PushBack(a, al);
        rows.push_back({o.arms[ai].name, std::to_string(n["pass"]), std::to_string(n["partial"]), std::to_string(n["fail"]), std::to_string(n["error"]),
                        num(100.0 * n["pass"] / total, 0) + " %", std::to_string(tin), std::to_string(tout), num(summarize(secs).median, 2),
                        std::to_string(unknown + bad_args + extra)});
        chart.series.push_back({o.arms[ai].name, {double(n["pass"]), double(n["partial"]), double(n["fail"]), double(n["error"])}, {}});
        verdicts += o.arms[ai].name + ": " + std::to_string(n["pass"]) + " of " + std::to_string(tasks.size()) + " tasks passed (" +
                    std::to_string(n["partial"]) + " partial, " + std::to_string(n["fail"]) + " failed" +
                    (n["error"] ? ", " + std::to_string(n["error"]) + " not run to the end: request errors" : "") + ")\n";
    }
    doc.AddMember("runs", runs, al).AddMember("arms", arms, al);
    std::string text = table({"ARM", "PASS", "PARTIAL", "FAIL", "ERROR", "PASS RATE", "TOKENS IN", "TOKENS OUT", "SECONDS (median)", "TOOL-CALL ERRORS"}, rows);
    text += verdicts + cut_warnings;
    if (o.json && !cut_warnings.empty()) std::fputs(cut_warnings.c_str(), stderr);
    if (o.arms.size() > 1) {
        // Pair by pair against the first arm: per task, and over all tasks (a run that errored
        // on either arm is left out of the pair).
        rapidjson::Value pairs(rapidjson::kArrayType);
        std::vector<std::vector<std::string>> prow;
        for (size_t b = 1; b < o.arms.size(); ++b) {
            std::vector<bool> pa, pb;
            rapidjson::Value differ(rapidjson::kArrayType);
            for (size_t ti = 0; ti < tasks.size(); ++ti) {
                const auto& x = results[0][ti];
                const auto& y = results[b][ti];
                if (x.outcome == "error" || y.outcome == "error") continue;
                pa.push_back(x.outcome == "pass");
                pb.push_back(y.outcome == "pass");
                if (x.outcome != y.outcome) {
                    rapidjson::Value d(rapidjson::kObjectType);
                    d.AddMember("task", sv(tasks[ti].id, al), al).AddMember(sv(o.arms[0].name, al), sv(x.outcome, al), al);
                    d.AddMember(sv(o.arms[b].name, al), sv(y.outcome, al), al);
                    differ.PushBack(d, al);
                }
            }
            agent::Paired p = agent::compare(pa, pb);
            rapidjson::Value pr(rapidjson::kObjectType);
            pr.AddMember("arm", sv(o.arms[b].name, al), al).AddMember("baseline", sv(o.arms[0].name, al), al).AddMember("tasks", p.n, al);
            pr.AddMember("both_pass", p.both, al).AddMember("only_baseline", p.only_a, al).AddMember("only_arm", p.only_b, al).AddMember("neither", p.neither, al);
            pr.AddMember("pass_rate_difference", p.diff, al);
            rapidjson::Value ci(rapidjson::kArrayType);
            ci.PushBack(p.lo, al).PushBack(p.hi, al);
            pr.AddMember("ci95", ci, al).AddMember("mcnemar_p", p.mcnemar_p, al).AddMember("differing_tasks", differ, al);
            pairs.PushBack(pr, al);
            prow.push_back({o.arms[b].name + " vs " + o.arms[0].name, std::to_string(p.n), std::to_string(p.only_b), std::to_string(p.only_a),
                            (p.diff >= 0 ? "+" : "") + num(100 * p.diff, 1) + " pt", "[" + num(100 * p.lo, 1) + ", " + num(100 * p.hi, 1) + "]",
                            num(p.mcnemar_p, 3)});
        }
        doc.AddMember("pairs", pairs, al);
        text += "\n" + table({"PAIR", "TASKS", "ONLY ARM PASSES", "ONLY BASELINE PASSES", "PASS RATE DIFF", "95 % CI", "McNEMAR p"}, prow);
    }
    return finish(o, doc, chart, text, errors > 0);
}

// ---- drift -------------------------------------------------------------------------------------------------

int drift(Options& o) {
    if (o.arms.size() != 2) throw Usage("drift compares exactly two arms: --arms A=URL,B=URL");
    int max_tokens = o.max_tokens > 0 ? o.max_tokens : 600;
    auto prompts = load_prompts(o.prompts.empty() ? (data_dir() / "decode_prompts.json").string() : o.prompts);
    auto infos = probe_all(o);
    Progress progress(prompts.size() * 2, o.json);
    auto doc = start_doc(o, infos, max_tokens, 1);
    auto& al = doc.GetAllocator();
    rapidjson::Value per(rapidjson::kArrayType);
    int identical = 0, compared = 0;
    std::vector<double> div_chars, ratios;
    bool failed = false;
    std::vector<std::vector<std::string>> rows;
    Chart chart{"decode tok/s per prompt", "tokens/s", {}, {{o.arms[0].name, {}, {}}, {o.arms[1].name, {}, {}}}};
    for (const auto& p : prompts) {
        progress.step(p.id + " on " + o.arms[0].name);
        StreamResult a = stream_chat(o.arms[0], chat_body(o, p, max_tokens), o.timeout);
        progress.step(p.id + " on " + o.arms[1].name);
        StreamResult b = stream_chat(o.arms[1], chat_body(o, p, max_tokens), o.timeout);
        rapidjson::Value v(rapidjson::kObjectType);
        v.AddMember("prompt", sv(p.id, al), al);
        if (!a.ok || !b.ok) {
            failed = true;
            v.AddMember("error", sv(!a.ok ? o.arms[0].name + ": " + a.error : o.arms[1].name + ": " + b.error, al), al);
            per.PushBack(v, al);
            continue;
        }
        ++compared;
        size_t n = 0;
        while (n < a.text.size() && n < b.text.size() && a.text[n] == b.text[n]) ++n;
        bool same = a.text == b.text;
        identical += same;
        // Whitespace-separated words before the first differing character.
        int words = 0;
        for (size_t i = 0; i < n; ++i)
            if ((i == 0 || std::isspace(static_cast<unsigned char>(a.text[i - 1]))) && !std::isspace(static_cast<unsigned char>(a.text[i]))) ++words;
        double ratio = a.decode_tps() > 0 ? b.decode_tps() / a.decode_tps() : 0;
        if (!same) div_chars.push_back(static_cast<double>(n));
        if (ratio > 0) ratios.push_back(ratio);
        v.AddMember("identical", same, al);
        if (!same) v.AddMember("first_divergence_char", static_cast<uint64_t>(n), al).AddMember("first_divergence_word", words, al);
        v.AddMember("decode_tps_a", a.decode_tps(), al).AddMember("decode_tps_b", b.decode_tps(), al).AddMember("decode_tps_ratio", ratio, al);
        per.PushBack(v, al);
        rows.push_back({p.id, same ? "yes" : "no", same ? "-" : std::to_string(n), num(a.decode_tps()), num(b.decode_tps()), num(ratio, 3)});
        chart.categories.push_back(p.id);
        chart.series[0].values.push_back(a.decode_tps());
        chart.series[1].values.push_back(b.decode_tps());
    }
    Summary ds = summarize(div_chars), rs = summarize(ratios);
    rapidjson::Value s(rapidjson::kObjectType);
    s.AddMember("compared", compared, al).AddMember("identical", identical, al);
    s.AddMember("identical_fraction", compared ? static_cast<double>(identical) / compared : 0.0, al);
    s.AddMember("first_divergence_char", summary_json(ds, al), al).AddMember("decode_tps_ratio", summary_json(rs, al), al);
    doc.AddMember("summary", s, al).AddMember("prompts", per, al);
    std::string text = table({"PROMPT", "IDENTICAL", "DIVERGES AT", o.arms[0].name + " tok/s", o.arms[1].name + " tok/s", "RATIO"}, rows) +
                       "identical outputs: " + std::to_string(identical) + "/" + std::to_string(compared) + "; decode ratio " +
                       o.arms[1].name + "/" + o.arms[0].name + " median " + num(rs.median, 3) + "\n";
    return finish(o, doc, chart, text, failed);
}

}  // namespace

int run_bench(int argc, const char* const* argv) {
    CLI::App bench{"Measurements against any OpenAI-compatible server (docs/BENCHMARKS.md).", "pulse bench"};
    args::style(bench);
    bench.footer(kFooter);
    CommandLine cl(bench);
    if (auto exit = args::parse(bench, argc, argv)) return *exit;
    for (auto& [name, cmd] : cl.tools) {
        if (!*cmd) continue;
        Options& o = cl.o;
        o.tool = name;
        try {
            cl.finish();
        } catch (const Usage& e) {
            return args::usage_error(*cmd, e.what());
        }
        try {
            if (name == "decode") return decode(o);
            if (name == "accept") return accept(o);
            if (name == "ttft") return ttft(o);
            if (name == "quality") return quality(o);
            if (name == "drift") return drift(o);
            return agent_bench(o);
        } catch (const Usage& e) {
            return args::usage_error(*cmd, e.what());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "pulse bench %s: %s\n", name.c_str(), e.what());
            return 1;
        }
    }
    return args::usage_error(bench, "give a tool: decode, accept, ttft, quality, drift or agent");
}

}  // namespace pulse::bench
