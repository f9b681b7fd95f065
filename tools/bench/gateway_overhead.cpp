// Gateway overhead benchmark: the same streaming load sent straight to a fake backend and
// through Pulse, interleaved round by round in one run (so machine noise hits both arms), at
// several concurrencies. Reports added time-to-first-token and added total time (p50, p99),
// the gateway's CPU time per streamed token, and its RSS per concurrent stream.
//
//   gateway_overhead --pulse BIN --fake BIN --plugins DIR [--tokens 64] [--delay-ms 2]
//                    [--concurrency 1,16,64,256] [--samples 128] [--json FILE] [--lockstep]
//                    [--stream-threads N]   (the gateway's server.stream_threads; 0 = a thread per stream)
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
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/subprocess.h"

using namespace std::chrono;
using pulse::test::Child;

namespace {

struct Sample {
    double ttfb_ms = -1, ttft_ms = -1, total_ms = -1;
    int tokens = 0;
    bool ok = false;
};

std::string arg(int argc, char** argv, const std::string& name, const std::string& def) {
    for (int i = 1; i + 1 < argc; ++i)
        if (argv[i] == name) return argv[i + 1];
    return def;
}

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

// One streaming request; `token_marker` identifies a line that carries a content token.
Sample one(uint16_t port, const std::string& path, const std::string& body, const std::string& token_marker) {
    Sample s;
    auto t0 = steady_clock::now();
    try {
        Poco::Net::HTTPClientSession sess("127.0.0.1", port);
        sess.setTimeout(Poco::Timespan(60, 0));
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
    return s;
}

// The samples of one arm (direct or through Pulse) at one concurrency.
struct Arm {
    std::vector<double> ttfb, ttft, total;
    long tokens = 0;
    int errors = 0;
    void add(const std::vector<Sample>& batch) {
        for (const auto& x : batch) {
            if (!x.ok) {
                ++errors;
                continue;
            }
            ttfb.push_back(x.ttfb_ms);
            ttft.push_back(x.ttft_ms);
            total.push_back(x.total_ms);
            tokens += x.tokens;
        }
    }
};

std::vector<Sample> batch(int n, uint16_t port, const std::string& path, const std::string& body, const std::string& marker) {
    std::vector<Sample> out(static_cast<size_t>(n));
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i) ts.emplace_back([&, i] { out[static_cast<size_t>(i)] = one(port, path, body, marker); });
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
    std::string pulse = arg(argc, argv, "--pulse", ""), fake = arg(argc, argv, "--fake", ""), plugins = arg(argc, argv, "--plugins", "");
    if (pulse.empty() || fake.empty() || plugins.empty()) {
        std::fprintf(stderr, "usage: gateway_overhead --pulse BIN --fake BIN --plugins DIR [--tokens N] [--delay-ms D] "
                             "[--concurrency 1,16,64,256] [--samples N] [--json FILE]\n");
        return 2;
    }
    int tokens = std::stoi(arg(argc, argv, "--tokens", "64"));
    int delay = std::stoi(arg(argc, argv, "--delay-ms", "2"));
    int samples = std::stoi(arg(argc, argv, "--samples", "128"));
    const std::string stream_threads = arg(argc, argv, "--stream-threads", "1");
    bool lockstep = false;
    for (int i = 1; i < argc; ++i) lockstep = lockstep || std::string(argv[i]) == "--lockstep";
    std::vector<int> levels;
    {
        std::istringstream in(arg(argc, argv, "--concurrency", "1,16,64,256"));
        for (std::string x; std::getline(in, x, ',');) levels.push_back(std::stoi(x));
    }
    ::signal(SIGPIPE, SIG_IGN);

    pulse::test::TempDir dir;
    std::string words;
    for (int i = 0; i < tokens; ++i) words += "tok" + std::to_string(i) + " ";
    auto script = dir.write("script.json", std::string(R"({")") + (lockstep ? "step_ms" : "delay_ms") + R"(":)" + std::to_string(delay) + R"(,"turns":[{"content":")" + words + R"("}]})");
    Child fk({fake, "--script", script.string(), "--port", "0"});
    uint16_t fport = wait_port(fk, false, std::regex(R"(listening on 127\.0\.0\.1:(\d+))"));

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
    // Warm both paths (connections, caches, lazy init).
    batch(4, fport, "/v1/chat/completions", direct_body, "\"content\":\"tok");
    batch(4, gport, "/v1/responses", pulse_body, "response.output_text.delta");

    std::string json = "{\"tokens\":" + std::to_string(tokens) + ",\"delay_ms\":" + std::to_string(delay) + ",\"lockstep\":" + (lockstep ? "true" : "false");
    long idle_rss = rss_kib(gpid);
    // The gateway's background CPU (health probes, control loop), measured while idle, so it
    // is not charged to the tokens.
    double idle0 = cpu_us(gpid);
    auto idle_t0 = steady_clock::now();
    std::this_thread::sleep_for(seconds(5));
    double idle_us_per_s = (cpu_us(gpid) - idle0) / duration<double>(steady_clock::now() - idle_t0).count();
    std::printf("gateway idle CPU: %.0f us/s (subtracted below)\n", idle_us_per_s);
    json += ",\"idle_cpu_us_per_s\":" + std::to_string(idle_us_per_s) + ",\"levels\":[";
    std::printf("gateway overhead: %d tokens per stream, %d ms between tokens (%s), interleaved direct/pulse rounds\n", tokens, delay,
                lockstep ? "one clock for all streams" : "each stream its own timer");
    std::printf("%6s %7s | %-21s | %-27s | %-27s | %-27s | %9s %9s %6s\n", "conc", "samples", "added TTFB ms p50/p99",
                "TTFT ms direct p50/p99", "TTFT ms pulse p50/p99", "added TTFT ms p50/p99", "add tot50", "cpu us/tk", "errors");
    for (size_t li = 0; li < levels.size(); ++li) {
        int c = levels[li];
        int rounds = std::max(2, samples / c);
        Arm direct, via;
        double cpu = 0;
        long peak_rss = idle_rss;
        for (int r = 0; r < rounds; ++r) {
            // Alternate which arm goes first, so drift does not favour one.
            for (int arm = 0; arm < 2; ++arm) {
                bool via_pulse = (arm == 0) == (r % 2 == 1);
                if (via_pulse) {
                    double c0 = cpu_us(gpid);
                    auto arm_t0 = steady_clock::now();
                    std::atomic<bool> sampling{true};
                    std::thread rss([&] {
                        while (sampling) {
                            peak_rss = std::max(peak_rss, rss_kib(gpid));
                            std::this_thread::sleep_for(milliseconds(5));
                        }
                    });
                    auto s = batch(c, gport, "/v1/responses", pulse_body, "response.output_text.delta");
                    sampling = false;
                    rss.join();
                    cpu += cpu_us(gpid) - c0 - idle_us_per_s * duration<double>(steady_clock::now() - arm_t0).count();
                    via.add(s);
                } else {
                    direct.add(batch(c, fport, "/v1/chat/completions", direct_body, "\"content\":\"tok"));
                }
            }
        }
        const auto &dt = direct.ttft, &pt = via.ttft, &dtot = direct.total, &ptot = via.total, &db = direct.ttfb, &pb = via.ttfb;
        const long tokens_through = via.tokens;
        const int errors = direct.errors + via.errors;
        double d50 = pct(dt, 50), d99 = pct(dt, 99), p50 = pct(pt, 50), p99 = pct(pt, 99);
        double add_tot = pct(ptot, 50) - pct(dtot, 50);
        double us_per_token = tokens_through ? cpu / static_cast<double>(tokens_through) : -1;
        double rss_per_stream = c > 0 ? static_cast<double>(peak_rss - idle_rss) / c : 0;
        double b50 = pct(pb, 50) - pct(db, 50), b99 = pct(pb, 99) - pct(db, 99);
        char d0[64], d1[64], d2[64], d3[64];
        std::snprintf(d0, sizeof d0, "%+.3f / %+.3f", b50, b99);
        std::snprintf(d1, sizeof d1, "%.3f / %.3f", d50, d99);
        std::snprintf(d2, sizeof d2, "%.3f / %.3f", p50, p99);
        std::snprintf(d3, sizeof d3, "%+.3f / %+.3f", p50 - d50, p99 - d99);
        std::printf("%6d %7zu | %-21s | %-27s | %-27s | %-27s | %+9.2f %9.2f %6d   rss +%.0f KiB/stream\n", c, pt.size(), d0, d1, d2, d3, add_tot,
                    us_per_token, errors, rss_per_stream);
        std::fflush(stdout);
        char row[640];
        std::snprintf(row, sizeof row,
                      "%s{\"concurrency\":%d,\"samples\":%zu,\"added_ttfb_p50_ms\":%.4f,\"added_ttfb_p99_ms\":%.4f,\"ttft_direct_p50_ms\":%.4f,\"ttft_direct_p99_ms\":%.4f,"
                      "\"ttft_pulse_p50_ms\":%.4f,\"ttft_pulse_p99_ms\":%.4f,\"added_total_p50_ms\":%.4f,"
                      "\"added_total_p99_ms\":%.4f,\"cpu_us_per_token\":%.3f,\"rss_kib_per_stream\":%.1f,\"errors\":%d}",
                      li ? "," : "", c, pt.size(), b50, b99, d50, d99, p50, p99, add_tot, pct(ptot, 99) - pct(dtot, 99), us_per_token,
                      rss_per_stream, errors);
        json += row;
    }
    json += "],\"cores\":" + std::to_string(std::thread::hardware_concurrency()) + "}";
    std::string out = arg(argc, argv, "--json", "");
    if (!out.empty()) std::ofstream(out) << json << "\n";
    gw.signal(SIGTERM);
    gw.wait(30);
    fk.signal(SIGTERM);
    fk.wait(10);
    return 0;
}
