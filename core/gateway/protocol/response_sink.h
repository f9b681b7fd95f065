// The client's side of one /v1/responses response — the last hop of the request path: the SSE
// events the response builder produces, framed for the client's HTTP version behind the
// response head; the headers Pulse adds (X-Pulse-Fallback, X-Pulse-Reasoning-Budget); the
// response's end: the stream's last chunk, or a whole JSON answer (a client that does not
// stream, or an error before any event). Every byte goes out through the exchange, which alone
// knows whether the client is lost.
//
// While the stream loop relays a response it takes the framed bytes (take()) into the client's
// queue itself; otherwise flush() queues them from the request's thread. Neither waits for the
// client: the exchange's Outbox holds what it has not taken yet.
#pragma once

#include <pulse/plugin.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_server.h"

namespace pulse::gateway {


class ResponseSink {
public:
    explicit ResponseSink(server::Exchange& ex) : ex_(ex) {}

    // One SSE event (the response builder's output).
    void event(std::string_view type, std::string_view json);
    // A header for the response: in the stream's head if it has not gone out yet, and in a
    // whole answer. The latest value for a name wins.
    void header(std::string name, std::string value);

    // The framed bytes produced since the last take, the head first (the stream loop's side).
    void take(std::string& wire);
    // Hands what is ready to the exchange, which sends what the client takes now and queues
    // the rest (never waits). False once the client is lost.
    bool flush();

    // The response as one JSON document instead of a stream.
    void answer(int status, std::string body);
    // An error answer in the OpenAI shape for `s` (status_errors.h: its HTTP status, type and
    // code); a Retry-After of at least `retry_after_s` when the status has one.
    void error(pulse_status_t s, const std::string& message, int retry_after_s = 0);
    bool has_answer() const { return answer_.has_value(); }
    // The end: the whole answer, or the stream's last chunk, queued behind what the client has
    // not taken yet (the accept loop sends the rest). False when the client is already lost.
    bool end();

    // The client is gone (a failed write, a hang-up, the stream loop gave up on it).
    bool lost() const { return ex_.lost(); }
    void lose() { ex_.give_up(); }
    // Sleeps until `until`, a hang-up of the client, or `wake_fd` readable, whichever is first;
    // true when the client is lost.
    bool wait_gone(std::chrono::steady_clock::time_point until, int wake_fd);

private:
    server::Exchange& ex_;
    std::string events_;  // SSE text not yet framed
    std::string wire_;    // framed bytes on their way to the exchange
    server::Headers headers_;
    bool head_sent_ = false;
    std::optional<std::string> answer_;
    int answer_status_ = 200;
};

}  // namespace pulse::gateway
