// Test harness for the gateway: runs a fake vLLM backend and `pulse serve` as real processes
// on loopback (ephemeral ports), and a small SSE client that checks every stream it reads
// against the Responses event rules.
#pragma once

#include <doctest/doctest.h>

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/ServerSocket.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string_view>
#include <thread>

#include <rapidjson/document.h>

#include "gateway/protocol/sse.h"
#include "support/eventually.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace pulse::test {

inline std::string env_or_fail(const char* name) {
    const char* v = std::getenv(name);
    REQUIRE_MESSAGE(v, std::string(name) << " must be set by the test runner");
    return v;
}

// Waits (bounded) until `text()` matches `re`; returns the first capture group.
template <class F>
std::string wait_for(F text, const std::regex& re, int timeout_ms = 10000) {
    std::smatch m;
    std::string t;
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        t = text();
        if (std::regex_search(t, m, re)) return m[1];
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL("timed out waiting for " << "pattern" << " in:\n" << t);
    return {};
}

struct FakeBackend {
    TempDir dir;
    std::unique_ptr<Child> child;
    uint16_t port = 0;
    std::filesystem::path record;

    // `extra`: more fake_vllm arguments (--served-name NAME: vLLM's 404 for any other model).
    explicit FakeBackend(const std::string& script, const std::string& flavor = "vllm", uint16_t fixed_port = 0,
                         const std::vector<std::string>& extra = {}) {
        auto s = dir.write("script.json", script);
        record = dir / "requests.jsonl";
        std::vector<std::string> argv{env_or_fail("PULSE_FAKE_VLLM"), "--script", s.string(), "--port", std::to_string(fixed_port),
                                      "--record", record.string(), "--flavor", flavor};
        argv.insert(argv.end(), extra.begin(), extra.end());
        child = std::make_unique<Child>(argv);
        // 30 s: a loaded CI machine running the sanitizer build starts it slowly.
        port = static_cast<uint16_t>(std::stoi(wait_for([&] { return child->stdout_so_far(); },
                                                        std::regex(R"(listening on 127\.0\.0\.1:(\d+))"), 30000)));
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port) + "/v1"; }
    // The request bodies the backend received (record lines that are requests).
    std::vector<std::string> requests() const {
        std::vector<std::string> out;
        std::istringstream in(read_file(record));
        for (std::string line; std::getline(in, line);)
            if (line.rfind("{\"served\"", 0) != 0) out.push_back(line);
        return out;
    }
    // The client port of each streamed response, in order: equal ports = one kept-alive connection.
    std::vector<int> connections() const {
        std::vector<int> out;
        std::istringstream in(read_file(record));
        std::smatch m;
        for (std::string line; std::getline(in, line);)
            if (std::regex_search(line, m, std::regex(R"("peer_port":(\d+))"))) out.push_back(std::stoi(m[1]));
        return out;
    }
    std::string log() const { return read_file(record); }
};

struct Gateway {
    TempDir dir;
    std::unique_ptr<Child> child;
    uint16_t port = 0;
    std::filesystem::path config;

    // `models_toml` is appended to a config whose plugin dir holds the shipped plugins and
    // the example backend.
    // Default upstream settings for tests: fast keepalives, one pass over the endpoints (no
    // retry window) unless a test asks for one.
    static constexpr const char* kUpstream = "keepalive_s = 0.3\nconnect_timeout_s = 5\nretry_window_s = 0\nhealth_interval_s = 0.2\n";

    // `extra_plugins`: {built test plugin name, installed name} pairs copied into the plugin dir.
    explicit Gateway(const std::string& models_toml, const std::string& server_toml = "", const std::string& upstream_toml = kUpstream,
                     const std::string& extra_toml = "", const std::vector<std::pair<std::string, std::string>>& extra_plugins = {}) {
        std::filesystem::create_directories(dir / "plugins");
        std::vector<std::string> plugins = {env_or_fail("PULSE_PLUGIN_BUILD_DIR") + "/qwen38.so", env_or_fail("PULSE_PLUGIN_BUILD_DIR") + "/llamacpp.so",
                                            env_or_fail("PULSE_TEST_PLUGIN_DIR") + "/example_echo.so"};
        // The decoder backend only where a model uses it (it is the slowest plugin to load).
        if (models_toml.find("decoder:") != std::string::npos || models_toml.find("plugin://decoder") != std::string::npos)
            plugins.push_back(env_or_fail("PULSE_PLUGIN_BUILD_DIR") + "/decoder.so");
        if (models_toml.find(".policy]") != std::string::npos) plugins.push_back(env_or_fail("PULSE_PLUGIN_BUILD_DIR") + "/policy.so");
        for (const auto& src : plugins) {
            auto dst = dir / "plugins" / std::filesystem::path(src).filename();
            std::filesystem::copy_file(src, dst);
            std::filesystem::permissions(dst, std::filesystem::perms(0755));
        }
        for (const auto& [from, to] : extra_plugins) {
            auto dst = dir / "plugins" / (to + ".so");
            std::filesystem::copy_file(env_or_fail("PULSE_TEST_PLUGIN_DIR") + "/" + from + ".so", dst);
            std::filesystem::permissions(dst, std::filesystem::perms(0755));
        }
        auto cfg = dir.write("pulse.toml", "[server]\nlisten = \"127.0.0.1:0\"\n" + server_toml + "\n[upstream]\n" + upstream_toml +
                                               "\n[plugins]\ndirs = [\"plugins\"]\ndropin_dirs = []\nruntime_dir = \"" +
                                               (dir / "run").string() + "\"\n" + extra_toml + "\n" + models_toml);
        config = cfg;
        child = std::make_unique<Child>(std::vector<std::string>{env_or_fail("PULSE_EXE"), "serve", "--config", cfg.string()},
                                        std::map<std::string, std::string>{{"PULSE_PLUGIN_DIRS", ""}, {"PULSE_QWEN_BACKENDS", ""},
                                                                           {"PULSE_GATEWAY_API_KEY", ""}});
        port = static_cast<uint16_t>(std::stoi(wait_for([&] { return child->stderr_so_far(); },
                                                        std::regex(R"(listening on http://127\.0\.0\.1:(\d+))"))));
    }
    std::string log() const { return child->stderr_so_far(); }
};

struct HttpResult {
    int status = 0;
    std::string body;
    std::string content_type, retry_after, fallback;  // fallback: X-Pulse-Fallback
    std::string budget;                                // X-Pulse-Reasoning-Budget
    std::string www_authenticate;
};

// GET `path`; the body, and the status in *status when asked.
inline std::string get(uint16_t port, const std::string& path, int* status = nullptr) {
    Poco::Net::HTTPClientSession s("127.0.0.1", port);
    s.setTimeout(Poco::Timespan(10, 0));
    Poco::Net::HTTPRequest req("GET", path, Poco::Net::HTTPMessage::HTTP_1_1);
    s.sendRequest(req);
    Poco::Net::HTTPResponse resp;
    std::string body((std::istreambuf_iterator<char>(s.receiveResponse(resp))), {});
    if (status) *status = static_cast<int>(resp.getStatus());
    return body;
}

// A loopback port free right now (for a server that must come back on the same port).
inline uint16_t free_port() {
    Poco::Net::ServerSocket s(Poco::Net::SocketAddress("127.0.0.1", 0));
    return s.address().port();
}


inline HttpResult post(uint16_t port, const std::string& path, const std::string& body,
                       const std::map<std::string, std::string>& headers = {}, int timeout_s = 20) {
    Poco::Net::HTTPClientSession s("127.0.0.1", port);
    s.setTimeout(Poco::Timespan(timeout_s, 0));
    Poco::Net::HTTPRequest req("POST", path, Poco::Net::HTTPMessage::HTTP_1_1);
    req.setContentType("application/json");
    req.setContentLength(static_cast<std::streamsize>(body.size()));
    for (const auto& [k, v] : headers) req.set(k, v);
    s.sendRequest(req) << body;
    Poco::Net::HTTPResponse resp;
    std::istream& in = s.receiveResponse(resp);
    HttpResult r;
    r.status = static_cast<int>(resp.getStatus());
    r.content_type = resp.getContentType();
    r.retry_after = resp.get("Retry-After", "");
    r.fallback = resp.get("X-Pulse-Fallback", "");
    r.budget = resp.get("X-Pulse-Reasoning-Budget", "");
    r.www_authenticate = resp.get("WWW-Authenticate", "");
    r.body.assign(std::istreambuf_iterator<char>(in), {});
    return r;
}

// A port that refuses connections but stays ours (bound, not listening) until release(), so a
// test running in parallel cannot take it.
struct DeadPort {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // children must not inherit it
    uint16_t port = 0;
    DeadPort() {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        socklen_t len = sizeof a;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
        port = ntohs(a.sin_port);
    }
    void release() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
    ~DeadPort() { release(); }
};

// A raw loopback connection, for what HTTP client libraries will not send.
struct Raw {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    explicit Raw(uint16_t port) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    }
    ~Raw() { ::close(fd); }
    bool send(std::string_view s) { return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size()); }
    // Reads until EOF or `ms`; `reset` tells whether the connection ended with an RST.
    std::string read_all(int ms, bool* reset = nullptr, bool* eof = nullptr) {
        std::string out;
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        char buf[65536];
        if (reset) *reset = false;
        if (eof) *eof = false;
        while (std::chrono::steady_clock::now() < until) {
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            ssize_t n = ::recv(fd, buf, sizeof buf, 0);
            if (n > 0) {
                out.append(buf, static_cast<size_t>(n));
                continue;
            }
            if (n < 0 && reset) *reset = errno == ECONNRESET;
            if (eof) *eof = n == 0;
            break;
        }
        return out;
    }
};

inline std::string post_head(const std::string& body, const std::string& version = "HTTP/1.1") {
    // Connection: close, so each answer ends with EOF and a reader knows it has all of it.
    return "POST /v1/responses " + version + "\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct Event {
    std::string type;
    std::shared_ptr<rapidjson::Document> json;
    const rapidjson::Value& operator[](const char* k) const { return (*json)[k]; }
};

struct Stream {
    std::vector<Event> events;
    std::vector<std::shared_ptr<rapidjson::Document>> items;  // output_item.done items, in order
    std::string terminal;                                      // response.completed / failed / incomplete
    std::shared_ptr<rapidjson::Document> response;             // the terminal event's response
    int keepalives = 0;                                        // in_progress events after the first

    const rapidjson::Value& item(size_t i) const { return *items.at(i); }
};

// Parses an SSE body and checks the Responses rules: sequence numbers 0..n-1, created then
// in_progress first, added -> deltas -> done per item with consecutive output_index, `.done`
// text equal to the concatenated deltas, one terminal event, last.
inline Stream check_stream(const std::string& body) {
    Stream st;
    pulse::gateway::SseParser parser;
    parser.feed(body, [&](std::string_view name, std::string_view data) {
        auto doc = std::make_shared<rapidjson::Document>();
        doc->Parse(data.data(), data.size());
        REQUIRE_MESSAGE(!doc->HasParseError(), "event data is not JSON: " << data);
        std::string type = (*doc)["type"].GetString();
        CHECK(type == std::string(name));  // the event: line matches the JSON type
        st.events.push_back({type, doc});
    });
    REQUIRE(st.events.size() >= 3);
    for (size_t i = 0; i < st.events.size(); ++i) CHECK(st.events[i]["sequence_number"].GetUint64() == i);
    CHECK(st.events[0].type == "response.created");
    CHECK(st.events[1].type == "response.in_progress");
    std::map<uint64_t, std::string> deltas;  // output_index -> concatenated delta text
    std::map<uint64_t, bool> open;
    std::map<uint64_t, std::string> added_ids;  // output_index -> call_id announced in `added`
    uint64_t next_index = 0;
    for (size_t i = 2; i < st.events.size(); ++i) {
        const Event& e = st.events[i];
        const std::string& t = e.type;
        bool terminal = t == "response.completed" || t == "response.failed" || t == "response.incomplete";
        if (terminal) {
            CHECK_MESSAGE(i + 1 == st.events.size(), "terminal event " << t << " is not last");
            st.terminal = t;
            st.response = std::make_shared<rapidjson::Document>();
            st.response->CopyFrom(e["response"], st.response->GetAllocator());
            continue;
        }
        if (t == "response.in_progress") {
            ++st.keepalives;
            continue;
        }
        REQUIRE_MESSAGE(e.json->HasMember("output_index"), t << " has no output_index");
        uint64_t oi = e["output_index"].GetUint64();
        if (t == "response.output_item.added") {
            CHECK(oi == next_index++);
            open[oi] = true;
            // Strict clients (openai-node 7) need a tool call's call_id and name in `added`.
            const auto& item = e["item"];
            std::string type = item["type"].GetString();
            if (type == "function_call" || type == "custom_tool_call") {
                CHECK_MESSAGE((item.HasMember("call_id") && item["call_id"].GetStringLength() > 0), t << " without a call_id");
                CHECK_MESSAGE((item.HasMember("name") && item["name"].GetStringLength() > 0), t << " without a name");
                added_ids[oi] = item.HasMember("call_id") ? item["call_id"].GetString() : "";
            }
            continue;
        }
        CHECK_MESSAGE(open[oi], t << " for output_index " << oi << " outside added..done");
        if (t.size() > 6 && t.substr(t.size() - 6) == ".delta") deltas[oi] += e["delta"].GetString();
        if (t == "response.output_text.done") CHECK(deltas[oi] == e["text"].GetString());
        if (t == "response.function_call_arguments.done") CHECK(deltas[oi] == e["arguments"].GetString());
        if (t == "response.custom_tool_call_input.done") CHECK(deltas[oi] == e["input"].GetString());
        if (t == "response.output_item.done") {
            if (added_ids.count(oi)) CHECK(added_ids[oi] == std::string(e["item"]["call_id"].GetString()));
            open[oi] = false;
            deltas[oi].clear();
            auto item = std::make_shared<rapidjson::Document>();
            item->CopyFrom(e["item"], item->GetAllocator());
            st.items.push_back(item);
        }
    }
    CHECK_MESSAGE(!st.terminal.empty(), "no terminal event");
    if (st.response && st.terminal != "response.failed") {
        const auto& u = (*st.response)["usage"];
        CHECK(u["input_tokens"].IsInt64());
        CHECK(u["output_tokens"].IsInt64());
        CHECK(u["total_tokens"].GetInt64() == u["input_tokens"].GetInt64() + u["output_tokens"].GetInt64());
    }
    return st;
}

}  // namespace pulse::test
