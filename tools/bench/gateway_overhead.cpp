// Gateway overhead benchmark: the same streaming load sent three ways, interleaved phase by
// phase in one run (so machine noise hits every arm): straight to a fake backend ("direct"),
// through a byte relay that parses nothing (tcp_relay: the kernel's cost of one relay hop, the
// floor for any gateway), and through Pulse. At several concurrencies it reports added
// time-to-first-byte/-token and added total time (p50, p99) against direct, the CPU time per
// streamed token of Pulse and of the byte relay, and Pulse's RSS per concurrent stream.
//
//   gateway_overhead --pulse BIN --fake BIN --relay BIN --plugins DIR [--tokens 64] [--delay-ms 2]
//                    [--concurrency 1,16,64,256] [--samples 128] [--json FILE] [--lockstep]
//                    [--arrivals steady|burst] [--stream-threads N] [--idle-s 5]
//
// Exits 1 when any request failed (the numbers are then not valid).
//
// --arrivals steady (default): C clients each send requests back to back on a keep-alive
// connection of their own, their starts spread evenly over one stream duration, so C streams
// are in flight at any moment and requests arrive one every (stream duration / C), as with C
// users; only requests sent while all C clients are busy are sampled. --arrivals burst: every
// phase starts its C requests, each on a new connection, in the same instant and samples them
// all (a stress of admission: C connections accepted and C requests set up at once).
//
// --stream-threads N: the gateway's server.stream_threads (relay threads, 1 to 64).
//
// --lockstep: the fake backend paces all streams by one clock (a token every --delay-ms for
// every stream at once), like a batched engine's decode steps; without it each stream sleeps
// --delay-ms between its own tokens, so streams drift apart.
//
// TTFB = request sent -> response headers received. TTFT = request sent -> first content token
// seen by the client (a Chat Completions chunk with non-empty delta.content directly; a
// response.output_text.delta through Pulse).
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "args/args.h"
#include "support/subprocess.h"

using namespace std::chrono;
using pulse::test::Child;

namespace {

struct Sample {
    double ttfb_ms = -1, ttft_ms = -1, total_ms = -1;
    int tokens = 0;
    bool ok = false;
};

uint16_t wait_port(Child& c, bool from_stderr, const std::regex& re) {
    std::smatch m;
    for (int i = 0; i < 1000; ++i) {
        std::string t = from_stderr ? c.stderr_so_far() : c.stdout_so_far();
        if (std::regex_search(t, m, re)) return static_cast<uint16_t>(std::stoi(m[1]));
        std::this_thread::sleep_for(milliseconds(10));
    }
    std::fprintf(stderr, "a server did not start\n%s\n", c.stderr_so_far().c_str());
    std::exit(1);
}

// One streaming request on `sess` (a new connection, or the one its last request used);
// `token_marker` identifies a line that carries a content token.
Sample one(Poco::Net::HTTPClientSession& sess, const std::string& path, const std::string& body, const std::string& token_marker) {
    Sample s;
    auto t0 = steady_clock::now();
    try {
        Poco::Net::HTTPRequest req("POST", path, Poco::Net::HTTPMessage::HTTP_1_1);
        req.setContentType("application/json");
        req.setContentLength(static_cast<std::streamsize>(body.size()));
        sess.sendRequest(req) << body;
        Poco::Net::HTTPResponse resp;
        std::istream& in = sess.receiveResponse(resp);
        s.ttfb_ms = duration<double, std::milli>(steady_clock::now() - t0).count();  // headers received
        if (resp.getStatus() != 200) return s;
        std::string line;
        bool done = false;
        while (std::getline(in, line)) {
            if (line.find(token_marker) != std::string::npos) {
                if (s.ttft_ms < 0) s.ttft_ms = duration<double, std::milli>(steady_clock::now() - t0).count();
                ++s.tokens;
            }
            if (line.find("[DONE]") != std::string::npos || line.find("\"type\":\"response.completed\"") != std::string::npos) done = true;
        }
        s.total_ms = duration<double, std::milli>(steady_clock::now() - t0).count();
        s.ok = done && s.ttft_ms >= 0;
    } catch (...) {
    }
    if (!s.ok) sess.reset();  // the next request starts on a new connection
    return s;
}

std::unique_ptr<Poco::Net::HTTPClientSession> session(uint16_t port) {
    auto sess = std::make_unique<Poco::Net::HTTPClientSession>("127.0.0.1", port);
    sess->setTimeout(Poco::Timespan(60, 0));
    sess->setKeepAlive(true);
    return sess;
}

// The samples of one arm (direct, byte relay or Pulse) at one concurrency.
// Requests not `sampled` only filled or drained the pipe: their tokens count (the CPU was
// spent on them), their times do not.
struct Arm {
    std::vector<double> ttfb, ttft, total;
    long tokens = 0;
    int errors = 0;
    double cpu_us = 0;  // of the process that relays this arm, when there is one
    void add(const std::vector<Sample>& batch, const std::vector<bool>& sampled) {
        for (size_t i = 0; i < batch.size(); ++i) {
            const auto& x = batch[i];
            if (!x.ok) {
                ++errors;
                continue;
            }
            tokens += x.tokens;
            if (!sampled[i]) continue;
            ttfb.push_back(x.ttfb_ms);
            ttft.push_back(x.ttft_ms);
            total.push_back(x.total_ms);
        }
    }
};

std::vector<Sample> batch(int n, uint16_t port, const std::string& path, const std::string& body, const std::string& marker) {
    std::vector<Sample> out(static_cast<size_t>(n));
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i)
        ts.emplace_back([&, i] {
            auto sess = session(port);
            out[static_cast<size_t>(i)] = one(*sess, path, body, marker);
        });
    for (auto& t : ts) t.join();
    return out;
}

// `c` clients, each sending `m + 2` requests back to back on its own keep-alive connection,
// client i starting i/c of a stream duration after the first: c streams are then in flight at
// any moment, their starts spread evenly, as with c users. Each client's first and last
// requests only fill and drain the pipe; the `m` between them run while all c clients are busy
// and are the sampled ones (`sampled`).
std::vector<Sample> closed_loop(int c, int m, duration<double> stream, uint16_t port, const std::string& path, const std::string& body,
                                const std::string& marker, std::vector<bool>& sampled) {
    const int per = m + 2;
    std::vector<Sample> out(static_cast<size_t>(c * per));
    sampled.assign(out.size(), false);
    std::vector<std::thread> ts;
    auto t0 = steady_clock::now();
    for (int i = 0; i < c; ++i) {
        ts.emplace_back([&, i] {
            std::this_thread::sleep_until(t0 + duration_cast<steady_clock::duration>(stream * i / c));
            auto sess = session(port);  // one keep-alive connection per client, as a Codex session keeps
            for (int k = 0; k < per; ++k) out[static_cast<size_t>(i * per + k)] = one(*sess, path, body, marker);
        });
        for (int k = 1; k <= m; ++k) sampled[static_cast<size_t>(i * per + k)] = true;
    }
    for (auto& t : ts) t.join();
    return out;
}

double pct(std::vector<double> v, double p) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

// utime + stime of a process, in microseconds.
double cpu_us(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), {});
    auto rp = s.rfind(')');
    std::istringstream in(s.substr(rp + 2));
    std::string tok;
    double ut = 0, st = 0;
    for (int field = 3; in >> tok; ++field) {
        if (field == 14) ut = std::stod(tok);
        if (field == 15) {
            st = std::stod(tok);
            break;
        }
    }
    return (ut + st) * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

long rss_kib(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string pulse, fake, plugins, relay_bin, stream_threads = "1", arrivals = "steady", out;
    int tokens = 64, delay = 2, samples = 128;
    double idle_s = 5;
    bool lockstep = false;
    std::vector<int> levels = {1, 16, 64, 256};
    CLI::App app{"Gateway overhead: direct, through a byte relay and through Pulse, at each concurrency (docs/PERFORMANCE.md).",
                 "gateway_overhead"};
    pulse::args::style(app);
    app.add_option("--pulse", pulse, "the pulse binary")->option_text("BIN")->required();
    app.add_option("--fake", fake, "the fake vLLM binary")->option_text("BIN")->required();
    app.add_option("--relay", relay_bin, "the byte relay (tcp_relay)")->option_text("BIN")->required();
    app.add_option("--plugins", plugins, "the plugin directory")->option_text("DIR")->required();
    app.add_option("--tokens", tokens, "tokens per answer (default 64)")->option_text("N")->check(CLI::PositiveNumber);
    app.add_option("--delay-ms", delay, "the fake backend's delay between tokens (default 2)")->option_text("D")->check(CLI::NonNegativeNumber);
    app.add_option("--concurrency", levels, "the levels (default 1,16,64,256)")->option_text("1,16,...")->delimiter(',')->check(CLI::PositiveNumber);
    app.add_option("--samples", samples, "requests per level and arm (default 128)")->option_text("N")->check(CLI::PositiveNumber);
    app.add_option("--arrivals", arrivals, "steady or burst (default steady)")->option_text("steady|burst")->check(CLI::IsMember({"steady", "burst"}));
    app.add_flag("--lockstep", lockstep, "every stream's tokens at the same instants");
    app.add_option("--stream-threads", stream_threads, "the gateway's stream threads (default 1)")->option_text("N");
    app.add_option("--idle-s", idle_s, "idle time measured after the load (default 5)")->option_text("S")->check(CLI::NonNegativeNumber);
    app.add_option("--json", out, "write the results here")->option_text("FILE");
    if (auto exit = pulse::args::parse(app, argc, argv)) return *exit;
    const bool steady = arrivals == "steady";
    ::signal(SIGPIPE, SIG_IGN);

    pulse::test::TempDir dir;
    std::string words;
    for (int i = 0; i < tokens; ++i) words += "tok" + std::to_string(i) + " ";
    auto script = dir.write("script.json", std::string(R"({")") + (lockstep ? "step_ms" : "delay_ms") + R"(":)" + std::to_string(delay) + R"(,"turns":[{"content":")" + words + R"("}]})");
    Child fk({fake, "--script", script.string(), "--port", "0"});
    uint16_t fport = wait_port(fk, false, std::regex(R"(listening on 127\.0\.0\.1:(\d+))"));
    Child rl({relay_bin, "--to", std::to_string(fport)});
    uint16_t rport = wait_port(rl, false, std::regex(R"(listening on 127\.0\.0\.1:(\d+))"));

    std::filesystem::create_directories(dir / "plugins");
    std::filesystem::copy_file(plugins + "/qwen38.so", dir / "plugins/qwen38.so");
    std::filesystem::permissions(dir / "plugins/qwen38.so", std::filesystem::perms(0755));
    auto cfg = dir.write("pulse.toml", "log_level = \"warn\"\n[server]\nlisten = \"127.0.0.1:0\"\nmax_streams = 300\nqueue = 512\nstream_threads = " + stream_threads + "\n"
                                       "[upstream]\nretry_window_s = 0\n[warmup]\nenabled = false\n"
                                       "[plugins]\ndirs = [\"plugins\"]\ndropin_dirs = []\nruntime_dir = \"" + (dir / "run").string() +
                                       "\"\n[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"http://127.0.0.1:" +
                                       std::to_string(fport) + "/v1\"\n");
    Child gw({pulse, "serve", "--config", cfg.string(), "--log-level", "info"}, {{"PULSE_LOG_TIMESTAMPS", "0"}});
    uint16_t gport = wait_port(gw, true, std::regex(R"(listening on http://127\.0\.0\.1:(\d+))"));
    pid_t gpid = gw.pid();

    const std::string direct_body = R"({"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]})";
    const std::string pulse_body = R"({"model":"m","stream":true,"store":false,"input":"go"})";
    const std::string chat_marker = "\"content\":\"tok", responses_marker = "response.output_text.delta";
    struct Way {
        const char* name;
        uint16_t port;
        const std::string *path, *body, *marker;
        pid_t pid;  // whose CPU is charged to this arm's tokens; 0 = none
    };
    const std::string chat_path = "/v1/chat/completions", responses_path = "/v1/responses";
    const Way ways[3] = {{"direct", fport, &chat_path, &direct_body, &chat_marker, 0},
                         {"relay", rport, &chat_path, &direct_body, &chat_marker, rl.pid()},
                         {"pulse", gport, &responses_path, &pulse_body, &responses_marker, gpid}};
    // Warm every path (connections, caches, lazy init); the direct one also times a stream.
    auto warm = batch(4, fport, chat_path, direct_body, chat_marker);
    batch(4, rport, chat_path, direct_body, chat_marker);
    batch(4, gport, responses_path, pulse_body, responses_marker);
    std::vector<double> warm_total;
    for (const auto& w : warm)
        if (w.ok) warm_total.push_back(w.total_ms);
    const double stream_ms = std::max(1.0, pct(warm_total, 50));

    std::string json = "{\"tokens\":" + std::to_string(tokens) + ",\"delay_ms\":" + std::to_string(delay) +
                       ",\"lockstep\":" + (lockstep ? "true" : "false") + ",\"arrivals\":\"" + arrivals + "\"";
    long idle_rss = rss_kib(gpid);
    // Background CPU of the gateway (health probes, control loop) and of the relay, measured
    // while idle, so it is not charged to the tokens.
    double idle_g0 = cpu_us(gpid), idle_r0 = cpu_us(rl.pid());
    auto idle_t0 = steady_clock::now();
    std::this_thread::sleep_for(duration<double>(idle_s));
    const double idled_s = duration<double>(steady_clock::now() - idle_t0).count();
    const double idle_us_per_s[3] = {0, (cpu_us(rl.pid()) - idle_r0) / idled_s, (cpu_us(gpid) - idle_g0) / idled_s};
    std::printf("idle CPU: gateway %.0f us/s, byte relay %.0f us/s (subtracted below)\n", idle_us_per_s[2], idle_us_per_s[1]);
    json += ",\"idle_cpu_us_per_s\":" + std::to_string(idle_us_per_s[2]) + ",\"stream_ms\":" + std::to_string(stream_ms) + ",\"levels\":[";
    std::printf("gateway overhead: %d tokens per stream, %d ms between tokens (%s), %s arrivals (a stream lasts %.0f ms direct)\n",
                tokens, delay, lockstep ? "one clock for all streams" : "each stream its own timer",
                steady ? "steady" : "burst", stream_ms);
    std::printf("added = through X minus direct (ms); cpu us/tk p/r = CPU per streamed token of Pulse / of the byte relay; "
                "ratio = p/r; err = failed requests direct/relay/pulse\n");
    std::printf("%5s %6s | %-19s | %-19s | %-17s | %-19s | %8s | %-13s %5s | %8s\n", "conc", "sampl", "pulse +TTFB p50/p99",
                "relay +TTFB p50/p99", "direct TTFT p50/99", "pulse +TTFT p50/p99", "pulse +tot", "cpu us/tk p/r", "ratio",
                "err d/r/p");
    int total_errors = 0;
    for (size_t li = 0; li < levels.size(); ++li) {
        const int c = levels[li];
        // Steady: each of the c clients contributes m sampled requests per phase.
        const int m = steady ? std::max(1, 16 / c) : 1;
        const int measured = c * m;
        const int rounds = std::max(2, (samples + measured - 1) / measured);
        Arm arm[3];
        long peak_rss = idle_rss;
        for (int r = 0; r < rounds; ++r) {
            for (int k = 0; k < 3; ++k) {
                // Rotate which arm goes first, so drift favours none.
                const int w = (r + k) % 3;
                const Way& way = ways[w];
                double c0 = way.pid ? cpu_us(way.pid) : 0;
                auto t0 = steady_clock::now();
                std::atomic<bool> sampling{true};
                std::thread rss;
                if (way.pid == gpid)
                    rss = std::thread([&] {
                        while (sampling) {
                            peak_rss = std::max(peak_rss, rss_kib(gpid));
                            std::this_thread::sleep_for(milliseconds(5));
                        }
                    });
                std::vector<bool> sampled(static_cast<size_t>(c), true);
                auto got = steady ? closed_loop(c, m, duration<double>(stream_ms / 1000.0), way.port, *way.path, *way.body, *way.marker, sampled)
                                  : batch(c, way.port, *way.path, *way.body, *way.marker);
                sampling = false;
                if (rss.joinable()) rss.join();
                if (way.pid)
                    arm[w].cpu_us += cpu_us(way.pid) - c0 - idle_us_per_s[w] * duration<double>(steady_clock::now() - t0).count();
                arm[w].add(got, sampled);
            }
        }
        const Arm &d = arm[0], &rl_arm = arm[1], &p = arm[2];
        const int errors = d.errors + rl_arm.errors + p.errors;
        char errs[48];
        std::snprintf(errs, sizeof errs, "%d/%d/%d", d.errors, rl_arm.errors, p.errors);
        auto per_token = [](const Arm& a) { return a.tokens ? a.cpu_us / static_cast<double>(a.tokens) : -1.0; };
        const double pcpu = per_token(p), rcpu = per_token(rl_arm);
        const double pb50 = pct(p.ttfb, 50) - pct(d.ttfb, 50), pb99 = pct(p.ttfb, 99) - pct(d.ttfb, 99);
        const double rb50 = pct(rl_arm.ttfb, 50) - pct(d.ttfb, 50), rb99 = pct(rl_arm.ttfb, 99) - pct(d.ttfb, 99);
        const double d50 = pct(d.ttft, 50), d99 = pct(d.ttft, 99);
        const double pt50 = pct(p.ttft, 50) - d50, pt99 = pct(p.ttft, 99) - d99;
        const double add_tot = pct(p.total, 50) - pct(d.total, 50);
        const double rss_per_stream = c > 0 ? static_cast<double>(peak_rss - idle_rss) / c : 0;
        char a[64], b[64], e[64], f[64], g[64];
        std::snprintf(a, sizeof a, "%+.3f / %+.3f", pb50, pb99);
        std::snprintf(b, sizeof b, "%+.3f / %+.3f", rb50, rb99);
        std::snprintf(e, sizeof e, "%.2f / %.2f", d50, d99);
        std::snprintf(f, sizeof f, "%+.3f / %+.3f", pt50, pt99);
        std::snprintf(g, sizeof g, "%.2f / %.2f", pcpu, rcpu);
        std::printf("%5d %6zu | %-19s | %-19s | %-17s | %-19s | %+8.2f | %-13s %5.2f | %8s  rss +%.0f KiB/stream\n", c, p.ttfb.size(), a,
                    b, e, f, add_tot, g, rcpu > 0 ? pcpu / rcpu : 0.0, errs, rss_per_stream);
        std::fflush(stdout);
        char row[900];
        std::snprintf(row, sizeof row,
                      "%s{\"concurrency\":%d,\"samples\":%zu,\"added_ttfb_p50_ms\":%.4f,\"added_ttfb_p99_ms\":%.4f,"
                      "\"relay_added_ttfb_p50_ms\":%.4f,\"relay_added_ttfb_p99_ms\":%.4f,\"ttft_direct_p50_ms\":%.4f,\"ttft_direct_p99_ms\":%.4f,"
                      "\"added_ttft_p50_ms\":%.4f,\"added_ttft_p99_ms\":%.4f,\"added_total_p50_ms\":%.4f,\"added_total_p99_ms\":%.4f,"
                      "\"cpu_us_per_token\":%.3f,\"relay_cpu_us_per_token\":%.3f,\"rss_kib_per_stream\":%.1f,\"errors\":%d}",
                      li ? "," : "", c, p.ttfb.size(), pb50, pb99, rb50, rb99, d50, d99, pt50, pt99, add_tot,
                      pct(p.total, 99) - pct(d.total, 99), pcpu, rcpu, rss_per_stream, errors);
        json += row;
        total_errors += errors;
    }
    json += "],\"cores\":" + std::to_string(std::thread::hardware_concurrency()) + "}";
    if (!out.empty()) std::ofstream(out) << json << "\n";
    gw.signal(SIGTERM);
    gw.wait(30);
    rl.signal(SIGTERM);
    rl.wait(10);
    fk.signal(SIGTERM);
    fk.wait(10);
    if (total_errors) std::fprintf(stderr, "gateway_overhead: %d requests failed: the numbers above are not valid\n", total_errors);
    return total_errors ? 1 : 0;
}
