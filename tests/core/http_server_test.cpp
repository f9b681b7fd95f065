// core/server: the front end's client writer. A handler never waits for a slow client: what the
// client has not taken when the handler returns is sent by the accept loop, bounded by
// server.send_timeout_s from the last byte taken.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "server/http_server.h"
#include "support/gateway_harness.h"

using namespace pulse;
using namespace std::chrono;

namespace {

// Far more than the socket buffers hold while the client reads nothing (loopback: a send
// buffer of at most 4 MiB, a receive buffer that grows only as the client reads).
constexpr size_t kBig = 16u << 20;

// The answer's bytes: position-dependent, so a lost or repeated piece shows.
std::string pattern(size_t n) {
    std::string s(n, ' ');
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 4093) % 26);
    return s;
}

struct Server {
    server::HttpServer srv;
    std::atomic<int> handled{0};  // handlers that have returned
    explicit Server(double send_timeout_s)
        : srv(cfg(send_timeout_s), [this](server::Exchange& ex) {
              if (ex.request().getURI() == "/big")
                  ex.respond(200, "text/plain", pattern(kBig));
              else
                  ex.respond(200, "text/plain", "small");
              ++handled;
          }) {
        srv.start();
    }
    static config::Server cfg(double send_timeout_s) {
        config::Server c;
        c.listen.port = 0;
        c.send_timeout_s = send_timeout_s;
        return c;
    }
};

metrics::Gauge& connections() { return metrics::global().gauge("pulse_http_connections", "client connections open"); }

}  // namespace

TEST_CASE("a whole answer the client has not read: the handler returns at once, the accept loop sends the rest, then the next request") {
    Server s(10);
    test::Raw c(s.srv.port());
    // Two requests on one keep-alive connection; the second waits in the socket meanwhile.
    REQUIRE(c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\nGET /small HTTP/1.1\r\nHost: x\r\n\r\n"));
    // Regression: the worker wrote the answer itself and blocked until the client had taken all
    // of it (here: never, while nothing is read), holding a thread per slow reader.
    CHECK(test::eventually([&] { return s.handled.load() >= 1; }, 2000));
    std::this_thread::sleep_for(milliseconds(300));
    CHECK(s.handled.load() == 1);  // the next request is read only once this answer is out
    const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(kBig) + "\r\n\r\n";
    const std::string expected = head + pattern(kBig) + "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nsmall";
    std::string got;
    const auto until = steady_clock::now() + seconds(30);
    while (got.size() < expected.size() && steady_clock::now() < until) got += c.read_all(200);
    CHECK(got.size() == expected.size());
    CHECK(got == expected);  // every byte, in order, then the pipelined request's answer
    CHECK(s.handled.load() == 2);
}

TEST_CASE("a client that never takes the rest of its answer: closed after send_timeout_s, counted") {
    auto& unfinished = metrics::global().counter("pulse_http_unfinished_answers_total", "");
    const uint64_t before = unfinished.value();
    Server s(1);
    test::Raw c(s.srv.port());
    REQUIRE(c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n"));
    REQUIRE(test::eventually([&] { return s.handled.load() == 1; }, 2000));
    CHECK(connections().value() >= 1);
    const auto t0 = steady_clock::now();
    // Closed by the server once nothing was taken for a second: no connection is left open.
    REQUIRE(test::eventually([&] { return connections().value() == 0; }, 5000));
    const auto waited = duration_cast<milliseconds>(steady_clock::now() - t0).count();
    MESSAGE("closed " << waited << " ms after the handler returned");
    CHECK(waited >= 700);  // not before the send timeout (1 s after the last byte taken)
    CHECK(unfinished.value() == before + 1);
}

TEST_CASE("a slow reader that keeps taking bytes is not cut: the send timeout counts from the last byte taken") {
    Server s(1);
    test::Raw c(s.srv.port());
    REQUIRE(c.send("GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    // Reads 2 MiB, then nothing for 600 ms, and so on: the whole answer takes several times the
    // send timeout, but the client never stops taking bytes for as long as the timeout.
    std::string got;
    const auto until = steady_clock::now() + seconds(60);
    char buf[65536];
    bool eof = false;
    while (!eof && steady_clock::now() < until) {
        size_t chunk = 0;
        while (chunk < (2u << 20)) {
            ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
            if (n <= 0) {
                eof = true;
                break;
            }
            got.append(buf, static_cast<size_t>(n));
            chunk += static_cast<size_t>(n);
        }
        if (!eof) std::this_thread::sleep_for(milliseconds(600));
    }
    REQUIRE(got.size() > kBig);
    CHECK(got.substr(got.size() - kBig) == pattern(kBig));
}

namespace {

int open_descriptors() {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
}

bool connect_to(int fd, uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

// A client socket connected to `port`, or -1 once this process has no descriptor left.
int connect_or_fail(uint16_t port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (!connect_to(fd, port)) {
        ::close(fd);
        return -1;
    }
    return fd;
}

}  // namespace

TEST_CASE("out of descriptors: connections wait in the kernel's queue, and accepting starts again once some are free") {
    Server s(10);
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    const int64_t base = connections().value();
    // A socket made before the limit is lowered and connected once the process has run out: the
    // kernel completes its handshake, and the loop has no descriptor to accept it with.
    const int last = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(last >= 0);
    rlimit low = saved;
    low.rlim_cur = std::min<rlim_t>(saved.rlim_max, static_cast<rlim_t>(open_descriptors() + 24));
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    std::vector<int> clients;
    for (int i = 0; i < 40; ++i) {  // the test's sockets and the loop's accepted ones share the limit
        int fd = connect_or_fail(s.srv.port());
        if (fd < 0) break;
        clients.push_back(fd);
    }
    const bool ran_out = clients.size() < 40;
    const bool last_connected = connect_to(last, s.srv.port());
    clients.push_back(last);
    std::this_thread::sleep_for(milliseconds(300));
    const int64_t accepted = connections().value() - base;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
    MESSAGE(clients.size() << " clients connected, " << accepted << " accepted while out of descriptors");
    REQUIRE(ran_out);
    REQUIRE(last_connected);
    CHECK(accepted < static_cast<int64_t>(clients.size()));  // some wait: the loop ran out
    for (int fd : clients) ::close(fd);
    // Nothing but the loop's own retry turns accepting back on: a new client is answered.
    test::Raw c(s.srv.port());
    REQUIRE(c.send("GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    std::string got;
    const auto until = steady_clock::now() + seconds(10);
    while (got.find("small") == std::string::npos && steady_clock::now() < until) got += c.read_all(200);
    CHECK(got.find("HTTP/1.1 200 OK") == 0);
    CHECK(got.find("small") != std::string::npos);
}

TEST_CASE("at capacity, a keep-alive client's next request is served: a request counts as done before its connection goes back") {
    // max_streams 1: 17 requests at once (1 + the spare workers). 16 wait in their handler; one
    // client sends its requests one after another on one connection, each the only free place.
    std::mutex m;
    std::condition_variable cv;
    bool release = false;
    std::atomic<int> held{0};
    config::Server cfg = Server::cfg(10);
    cfg.max_streams = 1;
    server::HttpServer srv(cfg, [&](server::Exchange& ex) {
        if (ex.request().getURI() == "/hold") {
            ++held;
            std::unique_lock lock(m);
            cv.wait_for(lock, seconds(60), [&] { return release; });
        }
        ex.respond(200, "text/plain", "small");
    });
    srv.start();
    std::vector<std::unique_ptr<test::Raw>> holders;
    for (int i = 0; i < 16; ++i) {
        holders.push_back(std::make_unique<test::Raw>(srv.port()));
        REQUIRE(holders.back()->send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"));
    }
    REQUIRE(test::eventually([&] { return held.load() == 16; }, 5000));
    // Regression: the pool counted a request done after its worker had handed the connection
    // back, so the loop could read the pipelined next request first and refuse it (503).
    constexpr int kRequests = 400;
    std::string requests;
    for (int i = 0; i < kRequests; ++i) requests += "GET /small HTTP/1.1\r\nHost: x\r\n\r\n";
    test::Raw c(srv.port());
    REQUIRE(c.send(requests));
    const std::string ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nsmall";
    std::string got;
    const auto until = steady_clock::now() + seconds(30);
    while (got.size() < ok.size() * kRequests && got.find("503") == std::string::npos && steady_clock::now() < until)
        got += c.read_all(100);
    CHECK(got.find("at_capacity") == std::string::npos);
    CHECK(got.size() == ok.size() * kRequests);
    {
        std::lock_guard lock(m);
        release = true;
    }
    cv.notify_all();
    srv.stop();
}
