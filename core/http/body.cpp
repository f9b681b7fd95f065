#include "http/body.h"

#include <algorithm>
#include <cctype>

namespace pulse::http {
namespace {

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace

BodyDecoder ResponseHead::decoder() const {
    switch (framing) {
        case Framing::chunked: return BodyDecoder(Framing::chunked);
        case Framing::length: return BodyDecoder(Framing::length, length);
        case Framing::until_close: break;
    }
    return BodyDecoder(Framing::until_close);
}

bool parse_response_head(std::string_view h, ResponseHead& out) {
    out = ResponseHead{};
    size_t eol = h.find("\r\n");
    std::string_view line = h.substr(0, eol);
    if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || line[8] != ' ') return false;
    for (size_t i = 9; i < 12; ++i) {
        if (line[i] < '0' || line[i] > '9') return false;
        out.status = out.status * 10 + (line[i] - '0');
    }
    bool chunked = false, has_length = false;
    out.close = line.substr(0, 8) == "HTTP/1.0";
    auto lower = [](std::string_view v) {
        std::string s(v);
        for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    while (eol != std::string_view::npos) {
        h.remove_prefix(eol + 2);
        eol = h.find("\r\n");
        std::string_view f = h.substr(0, eol);
        size_t colon = f.find(':');
        if (colon == std::string_view::npos) continue;
        const std::string name = lower(f.substr(0, colon));
        std::string value = lower(f.substr(colon + 1));
        value.erase(0, std::min(value.size(), value.find_first_not_of(" \t")));
        while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
        if (name == "transfer-encoding") {
            chunked = value.find("chunked") != std::string::npos;
        } else if (name == "content-length") {
            if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos) return false;
            out.length = std::stoll(value);
            has_length = true;
        } else if (name == "connection") {
            if (value.find("close") != std::string::npos) out.close = true;
        } else if (name == "retry-after") {
            // Seconds (an HTTP date is rare from model servers and is not used); capped at a day.
            int v = 0;
            for (size_t i = 0; i < value.size() && value[i] >= '0' && value[i] <= '9' && v < 86400; ++i) v = v * 10 + (value[i] - '0');
            out.retry_after_s = std::min(v, 86400);
        }
    }
    out.framing = chunked ? Framing::chunked : has_length ? Framing::length : Framing::until_close;
    if (!chunked && !has_length) out.close = true;
    return true;
}

namespace {
// A control character where a chunk extension or trailer field may have none (HTAB is allowed).
bool is_ctl(char c) { return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f; }
}  // namespace

bool BodyDecoder::fail(std::string why) {
    state_ = State::failed;
    error_ = std::move(why);
    return false;
}

bool BodyDecoder::feed(std::string_view raw, std::string& out, size_t* used) {
    if (state_ == State::failed) return false;
    if (used) *used = raw.size();
    if (framing_ == Framing::until_close) {
        out.append(raw);
        return true;
    }
    if (framing_ == Framing::length) {
        if (used && static_cast<int64_t>(raw.size()) > left_) raw = raw.substr(0, static_cast<size_t>(left_)), *used = raw.size();
        if (static_cast<int64_t>(raw.size()) > left_) return fail("more bytes than the Content-Length");
        out.append(raw);
        left_ -= static_cast<int64_t>(raw.size());
        if (left_ == 0) state_ = State::done;
        return true;
    }
    for (size_t i = 0; i < raw.size();) {
        if (state_ == State::data) {
            size_t n = static_cast<size_t>(std::min<int64_t>(left_, static_cast<int64_t>(raw.size() - i)));
            out.append(raw.substr(i, n));
            left_ -= static_cast<int64_t>(n);
            i += n;
            if (left_ == 0) state_ = State::data_cr;
        } else if (state_ == State::done) {
            if (!used) return fail("bytes after the end of the body");
            *used = i;
            return true;
        } else if (!frame_byte(raw[i++])) {
            return false;
        }
    }
    return true;
}

// One byte of chunked framing (size lines, extensions, CRLFs, trailers) moves the state on;
// false (failed) when it breaks the framing.
bool BodyDecoder::frame_byte(char c) {
    switch (state_) {
        case State::size: {
            int v = hex_value(c);
            if (v >= 0) {
                if (++size_digits_ > 15) return fail("chunk size too large");
                left_ = left_ * 16 + v;
            } else if (size_digits_ == 0) {
                return fail("malformed chunk size line");
            } else if (c == ';' || (!strict_ && (c == ' ' || c == '\t'))) {
                state_ = State::ext;
            } else if (c == '\r') {
                state_ = State::size_lf;
            } else if (c == '\n' && !strict_) {
                state_ = left_ == 0 ? State::trailer_start : State::data;
            } else {
                return fail("malformed chunk size line");
            }
            return true;
        }
        case State::ext:  // chunk extensions carry nothing we use
            if (strict_) {
                if (c == '\r') state_ = State::size_lf;
                else if (is_ctl(c)) return fail("malformed chunk extension");
            } else if (c == '\n') {
                state_ = left_ == 0 ? State::trailer_start : State::data;
            }
            return true;
        case State::size_lf:
            if (c != '\n') return fail("chunk size line not ended by CRLF");
            state_ = left_ == 0 ? State::trailer_start : State::data;
            return true;
        case State::data_cr:
            if (c == '\r') {
                state_ = State::data_lf;
            } else if (c == '\n' && !strict_) {
                state_ = State::size;
                size_digits_ = 0;
            } else {
                return fail("chunk data not followed by CRLF");
            }
            return true;
        case State::data_lf:
            if (c != '\n') return fail("chunk data not followed by CRLF");
            state_ = State::size;
            size_digits_ = 0;
            return true;
        case State::trailer_start:
            if (strict_ && c != '\r' && is_ctl(c)) return fail("last chunk not ended by CRLF");
            state_ = c == '\r' ? State::trailer_lf : c == '\n' ? State::done : State::trailer;
            return true;
        case State::trailer:  // trailer fields are ignored
            if (strict_) {
                if (c == '\r') state_ = State::trailer_line_lf;
                else if (is_ctl(c)) return fail("malformed trailer field");
            } else if (c == '\n') {
                state_ = State::trailer_start;
            }
            return true;
        case State::trailer_line_lf:
            if (c != '\n') return fail("trailer field not ended by CRLF");
            state_ = State::trailer_start;
            return true;
        case State::trailer_lf:
            if (c != '\n') return fail("last chunk not ended by CRLF");
            state_ = State::done;
            return true;
        case State::data:
        case State::done:
        case State::failed: break;  // not framing bytes
    }
    return state_ != State::failed;
}

bool BodyDecoder::at_eof() {
    if (framing_ == Framing::until_close && state_ != State::failed) state_ = State::done;
    return state_ == State::done;
}

}  // namespace pulse::http
