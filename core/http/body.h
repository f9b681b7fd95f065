// HTTP/1.1 message-body framing (RFC 9112 §6–7) for messages read without blocking: the
// stream loop reads upstream responses, and the server's accept loop client requests, in
// whatever pieces TCP delivers; both need the body bytes and to know where the body ends (so
// the connection can carry another message).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pulse::http {

class BodyDecoder;

// How a message's body ends: after the last chunk, after Content-Length bytes, or when the
// connection closes (a response without either).
enum class Framing { chunked, length, until_close };

// What an upstream response head says (RFC 9112 §4, §6.3): the status, how the body is framed,
// whether the connection closes after it, and a Retry-After in seconds (0 = none).
struct ResponseHead {
    int status = 0;
    Framing framing = Framing::until_close;
    int64_t length = 0;
    bool close = false;
    int retry_after_s = 0;
    BodyDecoder decoder() const;
};

// Parses a head without its final empty line ("HTTP/1.1 200 OK\r\nName: value..."). False when
// it is not a valid HTTP/1.x response head.
bool parse_response_head(std::string_view head, ResponseHead& out);

class BodyDecoder {
public:
    // `strict`: a chunked body's lines must end in CRLF and a chunk size be followed by nothing
    // but CRLF or an extension (RFC 9112 §7.1) — for requests from clients, where a reading
    // that differs from a front proxy's is request smuggling. Upstream responses are read
    // leniently (bare LF, whitespace after the size), as the model servers' clients do.
    explicit BodyDecoder(Framing f, int64_t length = 0, bool strict = false)
        : framing_(f), state_(f == Framing::length && length <= 0 ? State::done : State::size), left_(f == Framing::length ? length : 0),
          strict_(strict) {}

    // Consumes raw connection bytes, appending the body bytes they carry to `out`. Returns
    // false on a framing error (error() says what). Bytes after the body's end are an error,
    // unless `used` is given: then it gets how many bytes belonged to the body, and the rest is
    // the caller's (the next message on the connection).
    bool feed(std::string_view raw, std::string& out, size_t* used = nullptr);
    // The connection reached its end (EOF). Returns true when that is a valid end of the body.
    bool at_eof();

    bool complete() const { return state_ == State::done; }
    const std::string& error() const { return error_; }

private:
    enum class State { size, ext, size_lf, data, data_cr, data_lf, trailer_start, trailer, trailer_line_lf, trailer_lf, done, failed };
    bool fail(std::string why);
    bool frame_byte(char c);

    Framing framing_;
    State state_;
    int64_t left_;       // bytes left in this chunk (chunked) or in the body (length)
    int size_digits_ = 0;
    bool strict_;
    std::string error_;
};

}  // namespace pulse::http
