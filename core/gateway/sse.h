// Server-sent events: formatting our events, and an incremental parser for upstream streams.
#pragma once

#include <string>
#include <string_view>

namespace pulse::gateway {

// "event: TYPE\ndata: JSON\n\n". `json` must be a single line (compact JSON always is).
std::string sse_event(std::string_view type, std::string_view json);

// Incremental SSE parser (WHATWG rules that matter here): lines end in LF, CRLF or CR; lines
// starting with ':' are comments; `data:` lines of one event are joined with '\n'; an empty
// line dispatches the event. Feed it bytes in any split.
class SseParser {
public:
    // Calls on_event(std::string_view event_name, std::string_view data) per dispatched event.
    template <class F>
    void feed(std::string_view bytes, F&& on_event) {
        for (char c : bytes) {
            if (c == '\n' || c == '\r') {
                if (c == '\n' && last_was_cr_) {
                    last_was_cr_ = false;
                    continue;
                }
                last_was_cr_ = c == '\r';
                line(on_event);
            } else {
                last_was_cr_ = false;
                line_ += c;
                if (line_.size() > kMaxLine) overflow_ = true;
            }
        }
    }
    // True once a line longer than the limit was seen (the stream is then treated as broken).
    bool overflowed() const { return overflow_; }

    static constexpr size_t kMaxLine = 16 * 1024 * 1024;

private:
    template <class F>
    void line(F& on_event) {
        if (line_.empty()) {
            if (has_data_) on_event(std::string_view(event_), std::string_view(data_));
            event_.clear();
            data_.clear();
            has_data_ = false;
            return;
        }
        if (line_[0] != ':') {
            std::string_view l(line_);
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
        line_.clear();
    }

    std::string line_, event_, data_;
    bool has_data_ = false, last_was_cr_ = false, overflow_ = false;
};

}  // namespace pulse::gateway
