// Server-sent events: the incremental parser for upstream streams (the client's events are
// framed by ResponseSink::event).
#pragma once

#include <cstring>
#include <string>
#include <string_view>

namespace pulse::gateway {

// Incremental SSE parser (WHATWG rules that matter here): lines end in LF, CRLF or CR; lines
// starting with ':' are comments; `data:` lines of one event are joined with '\n'; an empty
// line dispatches the event. Feed it bytes in any split.
class SseParser {
public:
    // Calls on_event(std::string_view event_name, std::string_view data) per dispatched event.
    template <class F>
    void feed(std::string_view bytes, F&& on_event) {
        // Whole lines are taken as views of `bytes`; only a line split across two feeds is
        // copied (into line_). A stream sends one or a few short lines per token, so this is
        // the per-token path.
        while (!bytes.empty()) {
            if (last_was_cr_) {
                last_was_cr_ = false;
                if (bytes[0] == '\n') {  // the LF of a CRLF split across feeds
                    bytes.remove_prefix(1);
                    continue;
                }
            }
            size_t eol = end_of_line(bytes);
            if (eol == std::string_view::npos) {
                if (line_.size() + bytes.size() > kMaxLine) overflow_ = true;
                else line_.append(bytes);
                return;
            }
            std::string_view l = bytes.substr(0, eol);
            if (line_.size() + l.size() > kMaxLine) {
                overflow_ = true;
            } else if (!line_.empty()) {
                line_.append(l);
                l = line_;
            }
            if (bytes[eol] == '\r') {
                if (eol + 1 < bytes.size()) {
                    if (bytes[eol + 1] == '\n') ++eol;
                } else {
                    last_was_cr_ = true;  // the LF, if any, comes with the next feed
                }
            }
            bytes.remove_prefix(eol + 1);
            line(l, on_event);
            line_.clear();
        }
    }
    // True once a line longer than the limit was seen (the stream is then treated as broken).
    bool overflowed() const { return overflow_; }

    static constexpr size_t kMaxLine = 16 * 1024 * 1024;

private:
    // The first CR or LF (two vectorised scans instead of a byte loop).
    static size_t end_of_line(std::string_view b) {
        const void* lf = std::memchr(b.data(), '\n', b.size());
        size_t n = lf ? static_cast<size_t>(static_cast<const char*>(lf) - b.data()) : b.size();
        const void* cr = std::memchr(b.data(), '\r', n);
        if (cr) return static_cast<size_t>(static_cast<const char*>(cr) - b.data());
        return lf ? n : std::string_view::npos;
    }

    template <class F>
    void line(std::string_view l, F& on_event) {
        if (l.empty()) {
            if (has_data_) on_event(std::string_view(event_), std::string_view(data_));
            event_.clear();
            data_.clear();
            has_data_ = false;
            return;
        }
        if (l[0] == ':') return;  // a comment
        auto colon = l.find(':');
        std::string_view field = l.substr(0, colon);
        std::string_view value = colon == std::string_view::npos ? std::string_view() : l.substr(colon + 1);
        if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
        if (field == "data") {
            if (has_data_) data_ += '\n';
            data_ += value;
            has_data_ = true;
        } else if (field == "event") {
            event_ = value;
        }
    }

    std::string line_, event_, data_;
    bool has_data_ = false, last_was_cr_ = false, overflow_ = false;
};

}  // namespace pulse::gateway
