#include "plugin/host_api.h"

#include <cmath>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <new>

#include <rapidjson/error/en.h>

#include "common/log.h"
#include "common/metrics.h"

namespace pulse::host {
namespace {

std::string_view sv(pulse_str_t s) { return s.ptr ? std::string_view(s.ptr, s.len) : std::string_view(); }

// ---- memory ----
void* h_alloc(size_t size, size_t align) {
    if (align < alignof(std::max_align_t)) align = alignof(std::max_align_t);
    size = (size + align - 1) / align * align;
    return std::aligned_alloc(align, size ? size : align);
}
void h_free(void* p) { std::free(p); }

// ---- logging ----
log::Level to_level(pulse_log_level_t l) {
    if (l <= PULSE_LOG_TRACE) return log::Level::trace;
    if (l >= PULSE_LOG_ERROR) return log::Level::error;
    return static_cast<log::Level>(l);
}
bool h_log_enabled(pulse_host_ctx_t*, pulse_log_level_t level) { return log::enabled(to_level(level)); }
void h_log(pulse_host_ctx_t* ctx, pulse_call_t* call, pulse_log_level_t level, pulse_str_t msg) {
    try {
        std::string component = "plugin " + (ctx ? ctx->plugin_id : std::string("?"));
        if (ctx && ctx->generation > 1) component += "#" + std::to_string(ctx->generation);
        if (call && !call->request_id.empty()) component += " [" + call->request_id + "]";
        log::write(to_level(level), component, sv(msg));
    } catch (...) {
    }
}

// ---- errors, cancellation ----
pulse_status_t h_set_error(pulse_call_t* call, pulse_status_t status, pulse_str_t msg) {
    if (!call) return status;
    try {
        call->status = status;
        call->message.assign(sv(msg));
        call->has_message = !call->message.empty();
    } catch (...) {
    }
    return status;
}
bool h_call_cancelled(pulse_call_t* call) {
    return call && call->cancelled && call->cancelled->load(std::memory_order_relaxed);
}
uint64_t h_call_deadline_ms(pulse_call_t* call) { return call ? call->deadline_ms : 0; }
pulse_str_t h_call_request_id(pulse_call_t* call) {
    if (!call) return {"", 0};
    return {call->request_id.data(), call->request_id.size()};
}

// ---- registration ----
pulse_status_t reg_fail(pulse_host_ctx_t* ctx, std::string problem) {
    ctx->problems.push_back(std::move(problem));
    return PULSE_E_INVALID_ARGUMENT;
}

template <class VT>
pulse_status_t do_register(pulse_host_ctx_t* ctx, uint32_t kind, const char* kind_name, const VT* vt,
                           uint32_t vt_size, void* user, VT Registration::*slot) {
    if (!ctx) return PULSE_E_INVALID_ARGUMENT;
    try {
        if (!ctx->in_init) return reg_fail(ctx, std::string("register_") + kind_name + " called outside init");
        if (!vt) return reg_fail(ctx, std::string("register_") + kind_name + " with a NULL vtable");
        // The vtable's own struct_size must agree with the size argument; the minimum is the
        // v1.0 layout (everything up to the last 1.0 field).
        if (vt_size < offsetof(VT, name) + sizeof(vt->name) || vt->struct_size != vt_size)
            return reg_fail(ctx, std::string(kind_name) + " vtable: expected struct_size == vt_size >= " +
                                     std::to_string(offsetof(VT, name) + sizeof(vt->name)) + ", found struct_size " +
                                     std::to_string(vt->struct_size) + " and vt_size " + std::to_string(vt_size));
        if (!vt->name || !*vt->name) return reg_fail(ctx, std::string(kind_name) + " vtable has no name");
        if (!(ctx->declared_kinds & kind))
            return reg_fail(ctx, std::string("registered a ") + kind_name + " ('" + vt->name +
                                     "') but the plugin info does not declare that kind");
        Registration r;
        r.kind = kind;
        r.name = vt->name;
        r.user = user;
        // OBS pattern: copy what both sides know; a larger (newer) plugin vtable's tail is
        // ignored, a smaller (older) one leaves our newer fields zero = "not provided".
        std::memcpy(&(r.*slot), vt, std::min<size_t>(vt_size, sizeof(VT)));
        (r.*slot).struct_size = static_cast<uint32_t>(std::min<size_t>(vt_size, sizeof(VT)));
        ctx->registrations.push_back(std::move(r));
        return PULSE_OK;
    } catch (...) {
        return PULSE_E_INTERNAL;
    }
}
pulse_status_t h_register_translation(pulse_host_ctx_t* ctx, const pulse_translation_vt_t* vt, uint32_t size, void* user) {
    return do_register(ctx, PULSE_KIND_TRANSLATION, "translation", vt, size, user, &Registration::translation);
}
pulse_status_t h_register_backend(pulse_host_ctx_t* ctx, const pulse_backend_vt_t* vt, uint32_t size, void* user) {
    return do_register(ctx, PULSE_KIND_BACKEND, "backend", vt, size, user, &Registration::backend);
}
pulse_status_t h_register_controller(pulse_host_ctx_t* ctx, const pulse_controller_vt_t* vt, uint32_t size, void* user) {
    return do_register(ctx, PULSE_KIND_CONTROLLER, "controller", vt, size, user, &Registration::controller);
}
pulse_status_t h_register_policy(pulse_host_ctx_t* ctx, const pulse_policy_vt_t* vt, uint32_t size, void* user) {
    return do_register(ctx, PULSE_KIND_POLICY, "policy", vt, size, user, &Registration::policy);
}

// ---- JSON views ----
pulse_json_kind_t j_kind(const pulse_json_t* v) {
    if (!v) return PULSE_JSON_ABSENT;
    switch (unview(v)->GetType()) {
        case rapidjson::kNullType: return PULSE_JSON_NULL;
        case rapidjson::kFalseType: return PULSE_JSON_FALSE;
        case rapidjson::kTrueType: return PULSE_JSON_TRUE;
        case rapidjson::kNumberType: return PULSE_JSON_NUMBER;
        case rapidjson::kStringType: return PULSE_JSON_STRING;
        case rapidjson::kArrayType: return PULSE_JSON_ARRAY;
        case rapidjson::kObjectType: return PULSE_JSON_OBJECT;
    }
    return PULSE_JSON_ABSENT;
}
const pulse_json_t* j_member(const pulse_json_t* v, pulse_str_t key) {
    if (!v || !unview(v)->IsObject()) return nullptr;
    const auto& o = *unview(v);
    rapidjson::Value::ConstMemberIterator it =
        o.FindMember(rapidjson::StringRef(key.ptr ? key.ptr : "", static_cast<rapidjson::SizeType>(key.len)));
    return it == o.MemberEnd() ? nullptr : view(&it->value);
}
size_t j_size(const pulse_json_t* v) {
    if (!v) return 0;
    if (unview(v)->IsArray()) return unview(v)->Size();
    if (unview(v)->IsObject()) return unview(v)->MemberCount();
    return 0;
}
const pulse_json_t* j_at(const pulse_json_t* v, size_t i) {
    if (!v || !unview(v)->IsArray() || i >= unview(v)->Size()) return nullptr;
    return view(&(*unview(v))[static_cast<rapidjson::SizeType>(i)]);
}
const pulse_json_t* j_member_at(const pulse_json_t* v, size_t i, pulse_str_t* key) {
    if (!v || !unview(v)->IsObject() || i >= unview(v)->MemberCount()) return nullptr;
    auto it = unview(v)->MemberBegin() + static_cast<ptrdiff_t>(i);
    if (key) *key = {it->name.GetString(), it->name.GetStringLength()};
    return view(&it->value);
}
bool j_get_string(const pulse_json_t* v, pulse_str_t* out) {
    if (!v || !unview(v)->IsString() || !out) return false;
    *out = {unview(v)->GetString(), unview(v)->GetStringLength()};
    return true;
}
bool j_get_i64(const pulse_json_t* v, int64_t* out) {
    if (!v || !out) return false;
    const auto& x = *unview(v);
    if (x.IsInt64()) {
        *out = x.GetInt64();
        return true;
    }
    if (x.IsDouble()) {
        double d = x.GetDouble();
        // Range first: converting an out-of-range double to int64 is undefined behaviour.
        if (d >= -9.2e18 && d <= 9.2e18 && d == std::trunc(d)) {
            *out = static_cast<int64_t>(d);
            return true;
        }
    }
    return false;
}
bool j_get_f64(const pulse_json_t* v, double* out) {
    if (!v || !out || !unview(v)->IsNumber()) return false;
    *out = unview(v)->GetDouble();
    return true;
}
bool j_get_bool(const pulse_json_t* v, bool* out) {
    if (!v || !out || !unview(v)->IsBool()) return false;
    *out = unview(v)->GetBool();
    return true;
}

// ---- JSON writer ----
// What a call may do where the writer stands: "" when allowed, else the reason.
enum class Step { value, key, end_object, end_array };
std::string check_step(const pulse_json_writer_t& w, Step step, const char* fn) {
    const bool in_object = !w.open.empty() && w.open.back();
    const bool in_array = !w.open.empty() && !w.open.back();
    switch (step) {
        case Step::value:
            if (w.open.empty() && w.root_done) return std::string(fn) + ": a second top-level value (the writer holds exactly one)";
            if (in_object && w.expect_key) return std::string(fn) + ": a value inside an object where a key is expected (call key() first)";
            return {};
        case Step::key:
            if (!in_object) return std::string(fn) + (in_array ? ": inside an array" : ": outside any object");
            if (!w.expect_key) return std::string(fn) + ": a second key in a row (the previous key has no value)";
            return {};
        case Step::end_object:
            if (!in_object) return std::string(fn) + (in_array ? ": the innermost open container is an array" : ": no object is open");
            if (!w.expect_key) return std::string(fn) + ": the last key has no value";
            return {};
        case Step::end_array:
            if (!in_array) return std::string(fn) + (in_object ? ": the innermost open container is an object" : ": no array is open");
            return {};
    }
    return {};
}
// After a complete value at the current level.
void value_done(pulse_json_writer_t& w) {
    if (w.open.empty()) w.root_done = true;
    else if (w.open.back()) w.expect_key = true;
}
template <class F>
bool wr(pulse_json_writer_t* w, Step step, const char* fn, F&& f) {
    if (!w || w->failed) return false;
    try {
        if (std::string why = check_step(*w, step, fn); !why.empty()) {
            w->fail(std::move(why));
            return false;
        }
        if (std::string why = f(w->writer); !why.empty()) {
            w->fail(std::string(fn) + ": " + why);
            return false;
        }
    } catch (...) {
        w->fail(std::string(fn) + ": out of memory");
        return false;
    }
    return true;
}
std::string ok_or(bool ok, const char* why) { return ok ? std::string() : std::string(why); }

bool w_begin_object(pulse_json_writer_t* w) {
    return wr(w, Step::value, "begin_object()", [&](auto& x) {
        if (!x.StartObject()) return std::string("rejected");
        w->open.push_back(true);
        w->expect_key = true;
        return std::string();
    });
}
bool w_end_object(pulse_json_writer_t* w) {
    return wr(w, Step::end_object, "end_object()", [&](auto& x) {
        if (!x.EndObject()) return std::string("rejected");
        w->open.pop_back();
        w->expect_key = false;
        value_done(*w);
        return std::string();
    });
}
bool w_begin_array(pulse_json_writer_t* w) {
    return wr(w, Step::value, "begin_array()", [&](auto& x) {
        if (!x.StartArray()) return std::string("rejected");
        w->open.push_back(false);
        return std::string();
    });
}
bool w_end_array(pulse_json_writer_t* w) {
    return wr(w, Step::end_array, "end_array()", [&](auto& x) {
        if (!x.EndArray()) return std::string("rejected");
        w->open.pop_back();
        value_done(*w);
        return std::string();
    });
}
bool w_key(pulse_json_writer_t* w, pulse_str_t k) {
    return wr(w, Step::key, "key()", [&](auto& x) {
        if (!x.Key(k.ptr ? k.ptr : "", static_cast<rapidjson::SizeType>(k.len))) return std::string("the key is not valid UTF-8");
        w->expect_key = false;
        return std::string();
    });
}
// A scalar value: `emit` writes it and returns "" or the reason it could not.
template <class F>
bool scalar(pulse_json_writer_t* w, const char* fn, F&& emit) {
    return wr(w, Step::value, fn, [&](auto& x) {
        std::string why = emit(x);
        if (why.empty()) value_done(*w);
        return why;
    });
}
bool w_string(pulse_json_writer_t* w, pulse_str_t s) {
    return scalar(w, "string()", [&](auto& x) {
        return ok_or(x.String(s.ptr ? s.ptr : "", static_cast<rapidjson::SizeType>(s.len)), "the text is not valid UTF-8");
    });
}
bool w_i64(pulse_json_writer_t* w, int64_t v) {
    return scalar(w, "i64()", [&](auto& x) { return ok_or(x.Int64(v), "rejected"); });
}
bool w_f64(pulse_json_writer_t* w, double v) {
    return scalar(w, "f64()", [&](auto& x) { return ok_or(std::isfinite(v) && x.Double(v), "NaN and infinity have no JSON form"); });
}
bool w_bool(pulse_json_writer_t* w, bool v) {
    return scalar(w, "boolean()", [&](auto& x) { return ok_or(x.Bool(v), "rejected"); });
}
bool w_null(pulse_json_writer_t* w) {
    return scalar(w, "null()", [&](auto& x) { return ok_or(x.Null(), "rejected"); });
}
bool w_raw(pulse_json_writer_t* w, pulse_str_t json) {
    return scalar(w, "raw()", [&](auto& x) {
        rapidjson::Document d;
        d.Parse(json.ptr ? json.ptr : "", json.len);
        if (d.HasParseError())
            return "not a valid JSON value: " + std::string(rapidjson::GetParseError_En(d.GetParseError())) + " at offset " +
                   std::to_string(d.GetErrorOffset());
        return ok_or(d.Accept(x), "the value is not valid UTF-8");
    });
}
bool w_copy(pulse_json_writer_t* w, const pulse_json_t* v) {
    return scalar(w, "copy()", [&](auto& x) { return ok_or(v ? unview(v)->Accept(x) : x.Null(), "the value is not valid UTF-8"); });
}
const pulse_json_t* j_parse(pulse_call_t* call, pulse_str_t text) {
    if (!call) return nullptr;
    try {
        auto& d = call->parsed.emplace_back(&call->arena, 1024, &call->arena);
        d.Parse(text.ptr ? text.ptr : "", text.len);
        // Valid JSON with a number that does not fit a double (a model writing 3226e380) is not
        // invalid: such a number is kept as a string holding its text. RapidJSON refuses it
        // whatever the flags, so it is quoted and the text parsed again (the document copies
        // its strings, so the patched text may go).
        std::string patched;
        for (int n = 0; d.HasParseError() && d.GetParseError() == rapidjson::kParseErrorNumberTooBig && n < 64; ++n) {
            if (patched.empty()) patched.assign(text.ptr ? text.ptr : "", text.len);
            size_t at = d.GetErrorOffset(), end = at;
            while (end < patched.size() && std::strchr("+-.eE0123456789", patched[end]) && patched[end]) ++end;
            patched.insert(end, 1, '"');
            patched.insert(at, 1, '"');
            d.Parse(patched.data(), patched.size());
        }
        if (d.HasParseError()) {
            // The reason goes to the call's error: a plugin that returns an error status without
            // set_error still reports it (set_error replaces it).
            call->message = "invalid JSON: " + std::string(rapidjson::GetParseError_En(d.GetParseError())) + " at offset " +
                            std::to_string(d.GetErrorOffset());
            call->has_message = true;
            call->parsed.pop_back();
            return nullptr;
        }
        return view(&d);
    } catch (...) {
        return nullptr;
    }
}

size_t j_serialize(const pulse_json_t* v, char* buf, size_t cap) {
    if (!v) return 0;
    try {
        rapidjson::StringBuffer b;
        rapidjson::Writer<rapidjson::StringBuffer> w(b);
        unview(v)->Accept(w);
        size_t n = b.GetSize();
        if (buf && cap) std::memcpy(buf, b.GetString(), std::min(n, cap));
        return n;
    } catch (...) {
        return 0;
    }
}

// ---- deltas, chunks, requests, output: forward to the host's C++ interfaces ----
template <class F>
pulse_status_t fwd(F&& f) {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        return PULSE_E_RESOURCE_EXHAUSTED;
    } catch (...) {
        return PULSE_E_INTERNAL;
    }
}
pulse_status_t d_text(pulse_delta_sink_t* s, pulse_str_t t) { return fwd([&] { return s->text(sv(t)); }); }
pulse_status_t d_reasoning(pulse_delta_sink_t* s, pulse_str_t t) { return fwd([&] { return s->reasoning(sv(t)); }); }
pulse_status_t d_tool_begin(pulse_delta_sink_t* s, uint32_t i, pulse_tool_kind_t k, pulse_str_t id, pulse_str_t n, pulse_str_t ns) {
    return fwd([&] { return s->tool_begin(i, k, sv(id), sv(n), sv(ns)); });
}
pulse_status_t d_tool_args(pulse_delta_sink_t* s, uint32_t i, pulse_str_t f) { return fwd([&] { return s->tool_args(i, sv(f)); }); }
pulse_status_t d_tool_end(pulse_delta_sink_t* s, uint32_t i) { return fwd([&] { return s->tool_end(i); }); }
pulse_status_t d_finish(pulse_delta_sink_t* s, pulse_finish_t r) { return fwd([&] { return s->finish(r); }); }
pulse_status_t d_usage(pulse_delta_sink_t* s, const pulse_usage_t* u) {
    return fwd([&] {
        if (!u || u->struct_size < sizeof(uint32_t) + 4 * sizeof(int64_t)) return PULSE_E_ABI;
        return s->usage(*u);
    });
}
pulse_status_t d_error(pulse_delta_sink_t* s, pulse_status_t st, pulse_str_t m) { return fwd([&] { return s->error(st, sv(m)); }); }
pulse_status_t d_trail(pulse_delta_sink_t* s, const int32_t* tokens, size_t n, pulse_str_t raw) {
    return fwd([&] {
        if (n && !tokens) return PULSE_E_INVALID_ARGUMENT;
        return s->trail(tokens, n, sv(raw));
    });
}
pulse_status_t d_trail_lost(pulse_delta_sink_t* s, pulse_str_t why) { return fwd([&] { return s->trail_lost(sv(why)); }); }

pulse_status_t c_data(pulse_chunk_sink_t* s, pulse_str_t payload) { return fwd([&] { return s->data(sv(payload)); }); }
pulse_json_writer_t* c_begin(pulse_chunk_sink_t* s) {
    s->writer.reset();
    return &s->writer;
}
pulse_status_t c_end(pulse_chunk_sink_t* s) {
    return fwd([&] {
        if (!s->writer.complete()) {
            if (!s->writer.failed) s->writer.fail("chunk->end(): " + s->writer.incomplete_reason());
            return PULSE_E_INVALID_ARGUMENT;
        }
        return s->data(s->writer.text());
    });
}

pulse_status_t r_set_path(pulse_upstream_req_t* r, pulse_str_t p) {
    return fwd([&] {
        std::string_view path = sv(p);
        if (path.empty() || path.front() != '/') return PULSE_E_INVALID_ARGUMENT;
        r->path.assign(path);
        r->path_set = true;
        r->root_path = false;
        return PULSE_OK;
    });
}
pulse_status_t r_add_header(pulse_upstream_req_t* r, pulse_str_t n, pulse_str_t v) {
    return fwd([&] {
        // Refuse header injection: no CR/LF in names or values.
        for (char c : sv(n)) if (c == '\r' || c == '\n' || c == ':') return PULSE_E_INVALID_ARGUMENT;
        for (char c : sv(v)) if (c == '\r' || c == '\n') return PULSE_E_INVALID_ARGUMENT;
        r->headers.emplace_back(std::string(sv(n)), std::string(sv(v)));
        return PULSE_OK;
    });
}
pulse_status_t r_set_root_path(pulse_upstream_req_t* r, pulse_str_t p) {
    pulse_status_t rc = r_set_path(r, p);
    if (rc == PULSE_OK) r->root_path = true;
    return rc;
}
const pulse_json_t* r_prepared(pulse_upstream_req_t* r) { return r ? r->prepared : nullptr; }
pulse_status_t r_set_method(pulse_upstream_req_t* r, pulse_str_t m) {
    return fwd([&] {
        if (!r || (sv(m) != "GET" && sv(m) != "POST")) return PULSE_E_INVALID_ARGUMENT;
        r->method.assign(sv(m));
        return PULSE_OK;
    });
}
pulse_json_writer_t* r_body(pulse_upstream_req_t* r) { return &r->body; }
pulse_status_t r_annotate(pulse_upstream_req_t* r, pulse_str_t k, pulse_str_t v) {
    return fwd([&] {
        if (!r || sv(k).empty() || sv(k).size() > 64 || sv(v).size() > 1024) return PULSE_E_INVALID_ARGUMENT;
        r->notes[std::string(sv(k))] = std::string(sv(v));
        return PULSE_OK;
    });
}

pulse_status_t o_write(pulse_output_t* out, pulse_str_t text) {
    return fwd([&] {
        out->write(sv(text));
        return PULSE_OK;
    });
}

void m_counter_add(pulse_host_ctx_t* ctx, pulse_str_t name, pulse_str_t label, pulse_str_t value, uint64_t delta) {
    try {
        std::string n(sv(name));
        auto ok = [](char c, bool first) {
            return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
        };
        if (n.empty() || n.size() > 128) return;
        for (size_t i = 0; i < n.size(); ++i)
            if (!ok(n[i], i == 0)) return;
        metrics::Labels labels{{"plugin", ctx ? ctx->plugin_id : std::string("?")}};
        std::string l(sv(label));
        if (!l.empty()) {
            for (size_t i = 0; i < l.size(); ++i)
                if (!ok(l[i], i == 0) || l[i] == ':') return;
            labels.emplace_back(l, std::string(sv(value)));
        }
        metrics::global().counter(n, "counter reported by a plugin", labels).add(delta);
    } catch (...) {
    }
}
const pulse_metrics_ext_t kMetricsExt = {sizeof(pulse_metrics_ext_t), m_counter_add};

const void* h_get_extension(pulse_host_ctx_t*, const char* id) {
    if (id && std::strcmp(id, PULSE_EXT_METRICS) == 0) return &kMetricsExt;
    return nullptr;
}

const pulse_json_api_t kJson = {
    sizeof(pulse_json_api_t), j_kind, j_member, j_size, j_at, j_member_at, j_get_string, j_get_i64,
    j_get_f64, j_get_bool, w_begin_object, w_end_object, w_begin_array, w_end_array, w_key, w_string,
    w_i64, w_f64, w_bool, w_null, w_raw, w_copy, j_parse, j_serialize,
};
const pulse_delta_api_t kDelta = {
    sizeof(pulse_delta_api_t), d_text, d_reasoning, d_tool_begin, d_tool_args, d_tool_end, d_finish, d_usage, d_error,
    d_trail, d_trail_lost,
};
const pulse_chunk_api_t kChunk = {sizeof(pulse_chunk_api_t), c_data, c_begin, c_end};
const pulse_request_api_t kRequest = {sizeof(pulse_request_api_t), r_set_path, r_add_header, r_body, r_annotate, r_set_root_path, r_prepared,
                                     r_set_method};

const pulse_host_api_t kHost = {
    sizeof(pulse_host_api_t),
    PULSE_ABI_MAJOR,
    PULSE_ABI_MINOR,
    h_alloc,
    h_free,
    h_log_enabled,
    h_log,
    h_set_error,
    h_call_cancelled,
    h_call_deadline_ms,
    h_call_request_id,
    h_register_translation,
    h_register_backend,
    h_register_controller,
    &kJson,
    &kDelta,
    &kChunk,
    &kRequest,
    o_write,
    h_get_extension,
    h_register_policy,
};

}  // namespace

const pulse_host_api_t* api() { return &kHost; }

}  // namespace pulse::host

void pulse_json_writer::fail(std::string why) {
    failed = true;
    error = "JSON writer: " + std::move(why);
    if (call && !call->has_message) {
        call->message = error;
        call->has_message = true;
    }
}

std::string pulse_json_writer::incomplete_reason() const {
    if (failed) return error;
    if (!open.empty()) return std::to_string(open.size()) + " object(s)/array(s) still open";
    if (!root_done) return "nothing was written";
    return {};
}

namespace pulse::host {

const char* status_name(pulse_status_t s) {
    switch (s) {
        case PULSE_OK: return "OK";
        case PULSE_END: return "END";
        case PULSE_TIMEOUT: return "TIMEOUT";
        case PULSE_E_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
        case PULSE_E_UNSUPPORTED: return "UNSUPPORTED";
        case PULSE_E_UNAVAILABLE: return "UNAVAILABLE";
        case PULSE_E_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
        case PULSE_E_CANCELLED: return "CANCELLED";
        case PULSE_E_DEADLINE: return "DEADLINE";
        case PULSE_E_INTERNAL: return "INTERNAL";
        case PULSE_E_ABI: return "ABI";
        case PULSE_E_CONTEXT_LENGTH: return "CONTEXT_LENGTH";
        default: return "UNKNOWN";
    }
}

std::string call_error(const pulse_call& call, pulse_status_t status, std::string_view plugin_id) {
    if (call.has_message) return call.message;
    return "plugin '" + std::string(plugin_id) + "' returned " + status_name(status) + " (" +
           std::to_string(status) + ") without an error message (plugin bug)";
}

}  // namespace pulse::host
