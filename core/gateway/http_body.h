// HTTP/1.1 message-body framing (RFC 9112 §6–7) for an upstream response read without
// blocking: the stream loop gets raw bytes from the socket in whatever pieces TCP delivers and
// needs the body bytes, and to know where the body ends (so the connection can serve again).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pulse::gateway {

class BodyDecoder {
public:
    enum class Framing { chunked, length, until_close };

    explicit BodyDecoder(Framing f, int64_t length = 0)
        : framing_(f), state_(f == Framing::length && length <= 0 ? State::done : State::size), left_(f == Framing::length ? length : 0) {}

    // Consumes raw connection bytes, appending the body bytes they carry to `out`. Returns
    // false on a framing error (error() says what); bytes after the body's end are an error too.
    bool feed(std::string_view raw, std::string& out);
    // The connection reached its end (EOF). Returns true when that is a valid end of the body.
    bool at_eof();

    bool complete() const { return state_ == State::done; }
    const std::string& error() const { return error_; }

private:
    enum class State { size, ext, size_lf, data, data_cr, data_lf, trailer_start, trailer, trailer_lf, done, failed };
    bool fail(std::string why);

    Framing framing_;
    State state_;
    int64_t left_;       // bytes left in this chunk (chunked) or in the body (length)
    int size_digits_ = 0;
    std::string error_;
};

}  // namespace pulse::gateway
