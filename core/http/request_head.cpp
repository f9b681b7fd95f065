#include "http/request_head.h"

#include <algorithm>

namespace pulse::http {
namespace {

// tchar (RFC 9110 §5.6.2): what a method and a field name are made of.
bool is_tchar(unsigned char c) {
    if (c >= '0' && c <= '9') return true;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
    switch (c) {
        case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-': case '.':
        case '^': case '_': case '`': case '|': case '~': return true;
        default: return false;
    }
}

// field-value octets (RFC 9110 §5.5): visible characters, obs-text, SP and HTAB; never NUL,
// CR, LF or another control character.
bool is_field_char(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

bool is_ows(char c) { return c == ' ' || c == '\t'; }

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return (x >= 'A' && x <= 'Z' ? x | 0x20 : x) == (y >= 'A' && y <= 'Z' ? y | 0x20 : y);
           });
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
    return s;
}

std::string printable(std::string_view s) {
    std::string out;
    for (unsigned char c : s.substr(0, 40)) out += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
    return out;
}

HeadError bad(std::string message) { return {400, std::move(message)}; }

}  // namespace

HeadScan scan_request_head(std::string_view in, size_t from) {
    HeadScan s;
    size_t i = 0;
    while (i + 1 < in.size() && in[i] == '\r' && in[i + 1] == '\n') i += 2;  // empty lines before a request (RFC 9112 §2.2)
    s.start = i;
    size_t p = std::max(from, i);
    for (; p < in.size(); ++p) {
        const char c = in[p];
        if (c == '\n') {
            if (p == s.start || in[p - 1] != '\r') {
                s.state = HeadScan::State::bad_line_ending;
                return s;
            }
            if (p >= s.start + 3 && in.compare(p - 3, 4, "\r\n\r\n") == 0) {
                s.state = HeadScan::State::complete;
                s.end = p + 1;
                return s;
            }
        } else if (c == '\r' && p + 1 < in.size() && in[p + 1] != '\n') {
            s.state = HeadScan::State::bad_line_ending;
            return s;
        }
    }
    // A CR at the very end is checked again once its next byte is here.
    s.scanned = !in.empty() && in.back() == '\r' ? in.size() - 1 : in.size();
    return s;
}

namespace {

// request-line = method SP request-target SP HTTP-version (RFC 9112 §3): single spaces, nothing else.
std::optional<HeadError> parse_request_line(std::string_view line, RequestHead& out) {
    size_t sp1 = line.find(' ');
    size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
        return bad("the request line is not METHOD TARGET VERSION with single spaces");
    std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1), version = line.substr(sp2 + 1);
    if (method.empty() || !std::all_of(method.begin(), method.end(), [](unsigned char c) { return is_tchar(c); }))
        return bad("the request method is not a token");
    if (target.empty() || !std::all_of(target.begin(), target.end(), [](unsigned char c) { return c > 0x20 && c < 0x7f; }))
        return bad("the request target has a space, a control character or a non-ASCII byte");
    const bool version_form = version.size() == 8 && version.substr(0, 5) == "HTTP/" && version[5] >= '0' && version[5] <= '9' &&
                              version[6] == '.' && version[7] >= '0' && version[7] <= '9';
    if (!version_form) return bad("the request line does not end with an HTTP version (HTTP/1.1)");
    if (version != "HTTP/1.1" && version != "HTTP/1.0") return HeadError{505, "only HTTP/1.0 and HTTP/1.1 are served"};
    out.method = method;
    out.target = target;
    out.version = version;
    return std::nullopt;
}

}  // namespace

std::optional<HeadError> parse_request_head(std::string_view head, RequestHead& out) {
    out = RequestHead{};
    if (head.size() < 4 || head.substr(head.size() - 4) != "\r\n\r\n") return bad("the request head does not end with an empty line");
    head.remove_suffix(2);  // every line now ends with CRLF
    auto next_line = [&head]() {
        size_t eol = head.find("\r\n");
        std::string_view line = head.substr(0, eol);
        head.remove_prefix(eol + 2);
        return line;
    };

    std::string_view line = next_line();
    if (auto e = parse_request_line(line, out)) return e;

    int hosts = 0, lengths = 0;
    std::vector<std::string_view> codings;  // every Transfer-Encoding field's codings, in order
    while (!head.empty()) {
        line = next_line();
        if (is_ows(line.empty() ? 'x' : line.front()))
            return bad("obsolete line folding (a header line that starts with whitespace) is not accepted");
        size_t colon = line.find(':');
        if (colon == std::string_view::npos) return bad("a header line has no colon: '" + printable(line) + "'");
        std::string_view name = line.substr(0, colon), value = line.substr(colon + 1);
        if (name.empty()) return bad("a header line has no name");
        if (!std::all_of(name.begin(), name.end(), [](unsigned char c) { return is_tchar(c); }))
            return bad(is_ows(name.back()) ? "whitespace between a header name and its colon: '" + printable(name) + "'"
                                           : "a header name is not a token: '" + printable(name) + "'");
        if (!std::all_of(value.begin(), value.end(), [](unsigned char c) { return is_field_char(c); }))
            return bad("header " + std::string(name) + " has a control character in its value");
        if (out.fields.size() == kMaxHeaderFields)
            return HeadError{431, "the request has more than " + std::to_string(kMaxHeaderFields) + " header fields"};
        value = trim(value);
        if (iequals(name, "Host")) {
            ++hosts;
        } else if (iequals(name, "Content-Length")) {
            if (++lengths > 1) return bad("more than one Content-Length");
            if (value.empty() || value.size() > 18 || !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
                return bad("Content-Length is not a number of bytes (digits only): '" + printable(value) + "'");
            out.length = std::stoll(std::string(value));
        } else if (iequals(name, "Transfer-Encoding")) {
            // Empty list elements are ignored (RFC 9110 §5.6.1): ", chunked" is chunked.
            for (size_t b = 0; b <= value.size();) {
                size_t e = std::min(value.find(',', b), value.size());
                if (auto coding = trim(value.substr(b, e - b)); !coding.empty()) codings.push_back(coding);
                b = e + 1;
            }
            if (value.find_first_not_of(", \t") == std::string_view::npos) return bad("Transfer-Encoding names no coding");
        }
        out.fields.emplace_back(name, value);
    }

    const bool http11 = out.version == "HTTP/1.1";
    if (http11 && hosts != 1) return bad(hosts == 0 ? "an HTTP/1.1 request needs a Host header" : "more than one Host header");
    if (!codings.empty()) {
        // RFC 9112 §6.1 and §6.3: chunked must be the final coding, applied once; a request
        // that names a transfer coding and a length, or any coding in HTTP/1.0, is faulty.
        if (!http11) return bad("Transfer-Encoding in an HTTP/1.0 request");
        if (lengths) return bad("a request may not carry both Transfer-Encoding and Content-Length");
        if (!iequals(codings.back(), "chunked")) return bad("chunked is not the final transfer coding");
        if (std::any_of(codings.begin(), codings.end() - 1, [](std::string_view c) { return iequals(c, "chunked"); }))
            return bad("chunked is applied more than once");
        if (codings.size() > 1) return HeadError{501, "only the chunked transfer coding is supported"};
        out.body = RequestHead::Body::chunked;
    } else if (lengths) {
        out.body = out.length > 0 ? RequestHead::Body::length : RequestHead::Body::none;
    }
    return std::nullopt;
}

}  // namespace pulse::http
