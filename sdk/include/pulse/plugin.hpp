// Header-only C++17 convenience layer over pulse/plugin.h.
//
// Compiled INTO the plugin; nothing here crosses the ABI boundary. It gives plugin authors
// string_view conversions, typed wrappers over the host's JSON view and writer, and the
// exception shim: every entry point a plugin hands to the host should run its body through
// pulse::guard(), so that no C++ exception ever unwinds through host (C) frames.
#ifndef PULSE_PLUGIN_HPP
#define PULSE_PLUGIN_HPP

#include <pulse/plugin.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace pulse {

inline pulse_str_t str(std::string_view s) noexcept { return pulse_str_t{s.data(), s.size()}; }
inline std::string_view view(pulse_str_t s) noexcept {
    return s.ptr ? std::string_view(s.ptr, s.len) : std::string_view();
}

// " (did you mean 'X'?)" for the candidate closest to a misspelt `name` (at most a third of
// its letters edited, transpositions counting once), else "": for load errors that name an
// unknown key or component the way a person would correct it.
template <class Names>
std::string did_you_mean(std::string_view name, const Names& candidates) {
    auto distance = [](std::string_view a, std::string_view b) {  // optimal string alignment
        std::basic_string<size_t> m((a.size() + 1) * (b.size() + 1), 0);
        auto at = [&](size_t i, size_t j) -> size_t& { return m[i * (b.size() + 1) + j]; };
        for (size_t i = 0; i <= a.size(); ++i) at(i, 0) = i;
        for (size_t j = 0; j <= b.size(); ++j) at(0, j) = j;
        for (size_t i = 1; i <= a.size(); ++i)
            for (size_t j = 1; j <= b.size(); ++j) {
                const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
                size_t v = at(i - 1, j - 1) + cost;
                if (at(i - 1, j) + 1 < v) v = at(i - 1, j) + 1;
                if (at(i, j - 1) + 1 < v) v = at(i, j - 1) + 1;
                if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && at(i - 2, j - 2) + 1 < v) v = at(i - 2, j - 2) + 1;
                at(i, j) = v;
            }
        return at(a.size(), b.size());
    };
    std::string best;
    size_t best_d = name.size() / 3 + 1;
    for (const auto& c : candidates) {
        const std::string_view cv(c);
        if (cv == name) return {};
        if (const size_t dd = distance(name, cv); dd < best_d) best_d = dd, best = std::string(cv);
    }
    return best.empty() ? std::string() : " (did you mean '" + best + "'?)";
}

// A JSON string literal (with quotes) for `s`, for plugins that assemble small JSON payloads
// themselves (e.g. chunks a backend emits through chunk->data).
inline std::string json_quote(std::string_view s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\r': o += "\\r"; break;
            case '\t': o += "\\t"; break;
            default:
                if (c < 0x20) {
                    static const char* hex = "0123456789abcdef";
                    o += "\\u00";
                    o += hex[c >> 4];
                    o += hex[c & 15];
                } else {
                    o += static_cast<char>(c);
                }
        }
    }
    return o + "\"";
}

// Throw this from plugin code to return a specific status with a message; guard() converts it.
class Error : public std::exception {
public:
    Error(pulse_status_t status, std::string message)
        : status_(status), message_(std::move(message)) {}
    pulse_status_t status() const noexcept { return status_; }
    const char* what() const noexcept override { return message_.c_str(); }

private:
    pulse_status_t status_;
    std::string message_;
};

// Run `fn` (returning pulse_status_t) and convert any exception into a status + message.
template <class Fn>
pulse_status_t guard(const pulse_host_api_t* host, pulse_call_t* call, Fn&& fn) noexcept {
    try {
        return fn();
    } catch (const Error& e) {
        return host->set_error(call, e.status(), str(e.what()));
    } catch (const std::exception& e) {
        return host->set_error(call, PULSE_E_INTERNAL, str(e.what()));
    } catch (...) {
        return host->set_error(call, PULSE_E_INTERNAL, str("unknown exception"));
    }
}

// A read-only JSON view. Cheap to copy. Missing members give an "absent" view, so chains like
// req["reasoning"]["effort"].string_or("") never dereference NULL.
class Json {
public:
    Json() = default;
    Json(const pulse_json_api_t* api, const pulse_json_t* v) : api_(api), v_(v) {}

    pulse_json_kind_t kind() const { return v_ ? api_->kind(v_) : PULSE_JSON_ABSENT; }
    bool present() const { return v_ != nullptr; }
    bool is_null() const { return kind() == PULSE_JSON_NULL; }
    bool is_string() const { return kind() == PULSE_JSON_STRING; }
    bool is_number() const { return kind() == PULSE_JSON_NUMBER; }
    bool is_bool() const { return kind() == PULSE_JSON_TRUE || kind() == PULSE_JSON_FALSE; }
    bool is_array() const { return kind() == PULSE_JSON_ARRAY; }
    bool is_object() const { return kind() == PULSE_JSON_OBJECT; }

    Json operator[](std::string_view key) const {
        return Json(api_, v_ ? api_->member(v_, str(key)) : nullptr);
    }
    Json at(size_t i) const { return Json(api_, v_ ? api_->at(v_, i) : nullptr); }
    size_t size() const { return v_ ? api_->size(v_) : 0; }
    // Object member i as (key, value).
    std::pair<std::string_view, Json> member_at(size_t i) const {
        pulse_str_t k{nullptr, 0};
        const pulse_json_t* m = v_ ? api_->member_at(v_, i, &k) : nullptr;
        return {view(k), Json(api_, m)};
    }

    std::optional<std::string_view> string() const {
        pulse_str_t s;
        if (v_ && api_->get_string(v_, &s)) return view(s);
        return std::nullopt;
    }
    std::optional<int64_t> i64() const {
        int64_t x;
        if (v_ && api_->get_i64(v_, &x)) return x;
        return std::nullopt;
    }
    std::optional<double> f64() const {
        double x;
        if (v_ && api_->get_f64(v_, &x)) return x;
        return std::nullopt;
    }
    std::optional<bool> boolean() const {
        bool b;
        if (v_ && api_->get_bool(v_, &b)) return b;
        return std::nullopt;
    }
    std::string_view string_or(std::string_view d) const { return string().value_or(d); }
    // Compact JSON text of this value ("" when absent).
    std::string dump() const {
        if (!v_) return {};
        std::string out(api_->serialize(v_, nullptr, 0), '\0');
        api_->serialize(v_, out.data(), out.size());
        return out;
    }

    const pulse_json_t* raw() const { return v_; }
    const pulse_json_api_t* api() const { return api_; }

private:
    const pulse_json_api_t* api_ = nullptr;
    const pulse_json_t* v_ = nullptr;
};

// A thin wrapper over the host's streaming JSON writer.
class Writer {
public:
    Writer(const pulse_json_api_t* api, pulse_json_writer_t* w) : api_(api), w_(w) {}
    Writer& begin_object() { ok_ = ok_ && api_->begin_object(w_); return *this; }
    Writer& end_object() { ok_ = ok_ && api_->end_object(w_); return *this; }
    Writer& begin_array() { ok_ = ok_ && api_->begin_array(w_); return *this; }
    Writer& end_array() { ok_ = ok_ && api_->end_array(w_); return *this; }
    Writer& key(std::string_view k) { ok_ = ok_ && api_->key(w_, str(k)); return *this; }
    Writer& string(std::string_view s) { ok_ = ok_ && api_->string(w_, str(s)); return *this; }
    Writer& i64(int64_t x) { ok_ = ok_ && api_->i64(w_, x); return *this; }
    Writer& f64(double x) { ok_ = ok_ && api_->f64(w_, x); return *this; }
    Writer& boolean(bool b) { ok_ = ok_ && api_->boolean(w_, b); return *this; }
    Writer& null() { ok_ = ok_ && api_->null(w_); return *this; }
    Writer& raw(std::string_view json) { ok_ = ok_ && api_->raw(w_, str(json)); return *this; }
    Writer& copy(const Json& v) { ok_ = ok_ && api_->copy(w_, v.raw()); return *this; }
    // key + value in one call
    Writer& kv(std::string_view k, std::string_view v) { return key(k).string(v); }
    Writer& kv(std::string_view k, int64_t v) { return key(k).i64(v); }
    bool ok() const { return ok_; }

private:
    const pulse_json_api_t* api_;
    pulse_json_writer_t* w_;
    bool ok_ = true;
};

// Logging helper bound to a plugin instance.
class Log {
public:
    Log() = default;
    Log(const pulse_host_api_t* host, pulse_host_ctx_t* ctx) : host_(host), ctx_(ctx) {}
    void operator()(pulse_log_level_t level, std::string_view msg, pulse_call_t* call = nullptr) const {
        if (host_ && host_->log_enabled(ctx_, level)) host_->log(ctx_, call, level, str(msg));
    }

private:
    const pulse_host_api_t* host_ = nullptr;
    pulse_host_ctx_t* ctx_ = nullptr;
};

}  // namespace pulse

// PULSE_PLUGIN_INFO_HEAD and PULSE_BUILD_INFO come from plugin.h (they are plain C).

#endif  // PULSE_PLUGIN_HPP
