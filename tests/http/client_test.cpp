// core/http: the blocking client every non-relay caller uses, and the OpenAI error body.
#include <doctest/doctest.h>

#include <rapidjson/document.h>

#include <chrono>
#include <string>

#include "http/client.h"
#include "http/error_body.h"
#include "server/http_server.h"
#include "support/gateway_harness.h"

using namespace pulse;
using namespace std::chrono;

namespace {

// A front end that echoes what it got: method, target, a header field and the body.
struct EchoServer {
    server::HttpServer srv;
    std::string origin;
    explicit EchoServer(config::Server cfg = {}) : srv(with_port0(cfg), [](server::Exchange& ex) {
        const auto& r = ex.request();
        if (r.getURI() == "/big") return ex.respond(200, "text/plain", std::string(100000, 'x'));
        if (r.getURI() == "/stream") {
            std::string wire;
            ex.stream_head(wire, "text/event-stream", {{"X-Kind", "sse"}});
            ex.frame(wire, "data: one\n\n");
            ex.frame(wire, "data: two\n\n");
            ex.stream_end(wire);
            ex.send(wire);
            return;
        }
        std::string echo = r.getMethod() + " " + r.getURI() + " auth=" + r.get("Authorization", "-") + " type=" + r.get("Content-Type", "-") +
                           " body=" + ex.body();
        ex.respond(r.getURI() == "/missing" ? 404 : 200, "text/plain", echo, {{"X-Echo", "yes"}});
    }) {
        srv.start();
        origin = "http://127.0.0.1:" + std::to_string(srv.port()) + "/v1";
    }
    static config::Server with_port0(config::Server c) {
        c.listen.port = 0;
        return c;
    }
};

// A listening socket nobody accepts from: connects succeed (the backlog), nothing answers.
struct SilentServer : test::DeadPort {
    SilentServer() { REQUIRE(::listen(fd, 8) == 0); }
};

}  // namespace

TEST_CASE("fetch: a GET and a POST, with their fields, status and answer fields") {
    EchoServer e;
    http::Request get;
    get.target = http::under(e.origin, "/models");
    get.fields.emplace_back("Authorization", "Bearer k");
    http::Answer a = http::fetch(e.origin, get, http::Timeouts::all(5));
    CHECK(a.status == 200);
    CHECK(a.error.empty());
    CHECK(a.body == "GET /v1/models auth=Bearer k type=- body=");
    CHECK(a.field("x-echo") == "yes");  // names compare case-insensitively
    CHECK(a.field("X-Absent").empty());

    http::Request post;
    post.method = "POST";
    post.target = "/slots/0?action=save";
    post.body = R"({"filename":"a"})";
    http::Answer p = http::fetch(e.origin, post, http::Timeouts::all(5));
    CHECK(p.status == 200);
    CHECK(p.body == R"(POST /slots/0?action=save auth=- type=application/json body={"filename":"a"})");

    http::Request missing;
    missing.target = "/missing";
    CHECK(http::fetch(e.origin, missing, http::Timeouts::all(5)).status == 404);  // any status is an answer
}

TEST_CASE("fetch: the answer is cut at max_body") {
    EchoServer e;
    http::Request r;
    r.target = "/big";
    http::Answer a = http::fetch(e.origin, r, http::Timeouts::all(5), 1000);
    CHECK(a.status == 200);
    CHECK(a.body.size() == 1000);
}

TEST_CASE("fetch: no server, a server that never answers, a bad URL — status 0 and why, within the timeout") {
    http::Request r;
    r.target = "/models";
    http::Answer refused = http::fetch("http://127.0.0.1:" + std::to_string(test::DeadPort().port), r, http::Timeouts::all(5));
    CHECK(refused.status == 0);
    CHECK(!refused.timed_out);
    CHECK(refused.error.find("refused") != std::string::npos);

    SilentServer silent;
    const auto t0 = steady_clock::now();
    http::Answer slow = http::fetch("http://127.0.0.1:" + std::to_string(silent.port), r, http::Timeouts::all(0.5));
    const double took = duration<double>(steady_clock::now() - t0).count();
    CHECK(slow.status == 0);
    CHECK(slow.timed_out);
    CHECK(took >= 0.4);
    CHECK(took < 5);

    http::Answer bad = http::fetch("not a url at all \x01", r, http::Timeouts::all(1));
    CHECK(bad.status == 0);
    CHECK(!bad.error.empty());
}

TEST_CASE("open: a streamed answer read at the caller's pace") {
    EchoServer e;
    http::Request r;
    r.method = "POST";
    r.target = "/stream";
    r.body = "{}";
    std::string error;
    auto st = http::open(e.origin, r, http::Timeouts::all(5), &error);
    REQUIRE(st);
    CHECK(st->status() == 200);
    CHECK(st->field("X-Kind") == "sse");
    std::string all(std::istreambuf_iterator<char>(st->body()), {});
    CHECK(all == "data: one\n\ndata: two\n\n");  // de-chunked

    auto none = http::open("http://127.0.0.1:" + std::to_string(test::DeadPort().port), r, http::Timeouts::all(5), &error);
    CHECK(!none);
    CHECK(!error.empty());
}

TEST_CASE("error_body: the OpenAI shape, valid JSON whatever the message holds") {
    const std::string nasty = std::string("a \"quoted\" back\\slash, a tab\t, a bell\x07, a newline\n, bad UTF-8 \xff\xfe and é");
    const std::string body = http::error_body("invalid_request_error", nasty, "", "bad_thing");
    rapidjson::Document d;
    d.Parse(body.c_str(), body.size());
    REQUIRE(!d.HasParseError());
    const auto& e = d["error"];
    CHECK(std::string(e["type"].GetString()) == "invalid_request_error");
    CHECK(e["param"].IsNull());  // empty is null
    CHECK(std::string(e["code"].GetString()) == "bad_thing");
    const std::string msg = e["message"].GetString();
    CHECK(msg.find("a \"quoted\" back\\slash, a tab\t, a bell\x07, a newline\n") == 0);  // control characters kept, escaped
    CHECK(msg.find("bad UTF-8 ?? and ??") != std::string::npos);  // an invalid text keeps its ASCII

    const std::string fine = http::error_body("server_error", "all é fine", "input", "");
    d.Parse(fine.c_str(), fine.size());
    CHECK(std::string(d["error"]["message"].GetString()) == "all é fine");  // valid UTF-8 passes untouched
    CHECK(std::string(d["error"]["param"].GetString()) == "input");
    CHECK(d["error"]["code"].IsNull());
}
