#include "gateway/http_body.h"

#include <algorithm>

namespace pulse::gateway {
namespace {

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace

bool BodyDecoder::fail(std::string why) {
    state_ = State::failed;
    error_ = std::move(why);
    return false;
}

bool BodyDecoder::feed(std::string_view raw, std::string& out) {
    if (state_ == State::failed) return false;
    if (framing_ == Framing::until_close) {
        out.append(raw);
        return true;
    }
    if (framing_ == Framing::length) {
        if (static_cast<int64_t>(raw.size()) > left_) return fail("the backend sent more than its Content-Length");
        out.append(raw);
        left_ -= static_cast<int64_t>(raw.size());
        if (left_ == 0) state_ = State::done;
        return true;
    }
    size_t i = 0;
    while (i < raw.size()) {
        char c = raw[i];
        switch (state_) {
            case State::size: {
                int v = hex_value(c);
                if (v >= 0) {
                    if (++size_digits_ > 15) return fail("chunk size too large");
                    left_ = left_ * 16 + v;
                } else if (size_digits_ == 0) {
                    return fail("malformed chunk size line");
                } else if (c == ';' || c == ' ' || c == '\t') {
                    state_ = State::ext;
                } else if (c == '\r') {
                    state_ = State::size_lf;
                } else if (c == '\n') {
                    state_ = left_ == 0 ? State::trailer_start : State::data;
                } else {
                    return fail("malformed chunk size line");
                }
                ++i;
                break;
            }
            case State::ext:  // chunk extensions carry nothing we use
                if (c == '\n') state_ = left_ == 0 ? State::trailer_start : State::data;
                ++i;
                break;
            case State::size_lf:
                if (c != '\n') return fail("chunk size line not ended by CRLF");
                state_ = left_ == 0 ? State::trailer_start : State::data;
                ++i;
                break;
            case State::data: {
                size_t n = static_cast<size_t>(std::min<int64_t>(left_, static_cast<int64_t>(raw.size() - i)));
                out.append(raw.substr(i, n));
                left_ -= static_cast<int64_t>(n);
                i += n;
                if (left_ == 0) state_ = State::data_cr;
                break;
            }
            case State::data_cr:
                if (c == '\r') {
                    state_ = State::data_lf;
                } else if (c == '\n') {
                    state_ = State::size;
                    size_digits_ = 0;
                } else {
                    return fail("chunk data not followed by CRLF");
                }
                ++i;
                break;
            case State::data_lf:
                if (c != '\n') return fail("chunk data not followed by CRLF");
                state_ = State::size;
                size_digits_ = 0;
                ++i;
                break;
            case State::trailer_start:
                state_ = c == '\r' ? State::trailer_lf : c == '\n' ? State::done : State::trailer;
                ++i;
                break;
            case State::trailer:  // trailer fields are ignored
                if (c == '\n') state_ = State::trailer_start;
                ++i;
                break;
            case State::trailer_lf:
                if (c != '\n') return fail("last chunk not ended by CRLF");
                state_ = State::done;
                ++i;
                break;
            case State::done: return fail("the backend sent bytes after the end of the body");
            case State::failed: return false;
        }
    }
    return true;
}

bool BodyDecoder::at_eof() {
    if (framing_ == Framing::until_close && state_ != State::failed) state_ = State::done;
    return state_ == State::done;
}

}  // namespace pulse::gateway
