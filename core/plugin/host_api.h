// The host side of the plugin ABI: definitions of the opaque handle types declared in
// pulse/plugin.h, and the one host function table every plugin receives.
//
// Handles that route output (delta sink, chunk sink, upstream request, controller output) are
// abstract C++ classes here; the C tables in host_api.cpp forward to their virtual methods, so
// each host component implements only the interface it needs. Exceptions never cross into
// plugin frames: every table function catches and turns them into a status.
#pragma once

#include <pulse/plugin.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

// One host->plugin call. Single-threaded, never retained by the plugin.
struct pulse_call {
    // Documents from json->parse take their values and their parse stack from `arena`, which
    // reset() rewinds: a streamed chunk (one parse per call, a few hundred bytes) costs one list
    // node, not an allocator, a 64 KiB chunk and a stack. Bigger documents spill into heap
    // chunks that reset() frees. A list, because a call that parses nothing (most) then
    // allocates nothing.
    using ParsedDoc = rapidjson::GenericDocument<rapidjson::UTF8<>, rapidjson::MemoryPoolAllocator<>, rapidjson::MemoryPoolAllocator<>>;

    pulse_status_t status = PULSE_OK;
    std::string message;  // copied from set_error
    bool has_message = false;
    const std::atomic<bool>* cancelled = nullptr;
    uint64_t deadline_ms = 0;
    std::string request_id;
    alignas(8) char arena_buf[8192];
    rapidjson::MemoryPoolAllocator<> arena{arena_buf, sizeof arena_buf};
    std::list<ParsedDoc> parsed;  // documents from json->parse, valid until reset()

    pulse_call() = default;
    pulse_call(const pulse_call&) = delete;  // `arena` points into this object
    pulse_call& operator=(const pulse_call&) = delete;

    void clear_error() {
        status = PULSE_OK;
        message.clear();
        has_message = false;
    }
    // Starts a new call on the same object: error slot and parsed documents are per call.
    void reset() {
        clear_error();
        parsed.clear();
        arena.Clear();
    }
};

// A JSON writer handed to a plugin. The host checks every call against the JSON grammar itself
// (RapidJSON's writer only asserts, which would abort the host on a plugin's mistake): the
// first wrong call fails the writer, `error` says why, and so does the bound call's error
// message unless the plugin set one.
struct pulse_json_writer {
    using Writer = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::CrtAllocator,
                                     rapidjson::kWriteValidateEncodingFlag>;
    rapidjson::StringBuffer buffer;
    Writer writer{buffer};
    bool failed = false;
    std::string error;              // why the writer failed
    pulse_call* call = nullptr;     // the call this writer belongs to, if any (gets `error` too)
    std::vector<bool> open;         // per open container: true = object
    bool expect_key = false;        // in an object, between members
    bool root_done = false;

    std::string_view text() const { return {buffer.GetString(), buffer.GetSize()}; }
    bool complete() const { return !failed && root_done && open.empty(); }
    // The reason an unfinished or failed writer cannot be used ("" when complete).
    std::string incomplete_reason() const;
    void fail(std::string why);
    void reset() {
        buffer.Clear();
        writer.Reset(buffer);
        failed = false;
        error.clear();
        open.clear();
        expect_key = false;
        root_done = false;
    }
};

struct pulse_delta_sink {
    virtual ~pulse_delta_sink() = default;
    virtual pulse_status_t text(std::string_view t) = 0;
    virtual pulse_status_t reasoning(std::string_view t) = 0;
    virtual pulse_status_t tool_begin(uint32_t index, pulse_tool_kind_t kind, std::string_view call_id,
                                      std::string_view name, std::string_view ns) = 0;
    virtual pulse_status_t tool_args(uint32_t index, std::string_view fragment) = 0;
    virtual pulse_status_t tool_end(uint32_t index) = 0;
    virtual pulse_status_t finish(pulse_finish_t reason) = 0;
    virtual pulse_status_t usage(const pulse_usage_t& u) = 0;
    virtual pulse_status_t error(pulse_status_t status, std::string_view message) = 0;
    // 1.3: the backend's token record (delta->trail, delta->trail_lost). A sink that resumes
    // nothing may ignore it.
    virtual pulse_status_t trail(const int32_t*, size_t, std::string_view) { return PULSE_OK; }
    virtual pulse_status_t trail_lost(std::string_view) { return PULSE_OK; }
};

struct pulse_chunk_sink {
    virtual ~pulse_chunk_sink() = default;
    virtual pulse_status_t data(std::string_view payload) = 0;
    pulse_json_writer writer;  // for begin/end
};

struct pulse_upstream_req {
    // A 1.0 profile that never called set_path gets the path 1.0 documented as the default.
    std::string path = "/chat/completions";
    std::string method = "POST";               // request->set_method (1.4): cache_request's requests only
    std::vector<std::pair<std::string, std::string>> headers;
    pulse_json_writer body;
    std::map<std::string, std::string> notes;  // request->annotate (1.1)
    bool path_set = false;                     // the profile set the path (a prepare that sets none asks nothing)
    bool root_path = false;                    // request->set_root_path (1.3): `path` is from the server's root
    const pulse_json_t* prepared = nullptr;    // request->prepared (1.3); the session owns the answer

    // Empty again, for a request built once more (the body writer points into this object:
    // it is reset in place, never copied). What was prepared stays.
    void reset() {
        path = "/chat/completions";
        method = "POST";
        headers.clear();
        body.reset();
        notes.clear();
        path_set = root_path = false;
    }
};

struct pulse_output {
    virtual ~pulse_output() = default;
    virtual void write(std::string_view text) = 0;
};

namespace pulse::host {

struct Registration {
    uint32_t kind = 0;  // PULSE_KIND_*
    std::string name;
    void* user = nullptr;
    pulse_translation_vt_t translation{};  // host-sized, zero-initialised copies
    pulse_backend_vt_t backend{};
    pulse_controller_vt_t controller{};
    pulse_policy_vt_t policy{};
};

}  // namespace pulse::host

// The plugin instance as the host sees it.
struct pulse_host_ctx {
    std::string plugin_id;
    uint64_t generation = 0;
    uint32_t declared_kinds = 0;
    bool in_init = false;
    std::vector<pulse::host::Registration> registrations;  // filled during init
    std::vector<std::string> problems;                     // registration errors, reported after init
};

namespace pulse::host {

// The host function table (static storage; valid for the process lifetime).
const pulse_host_api_t* api();

inline const pulse_json_t* view(const rapidjson::Value* v) { return reinterpret_cast<const pulse_json_t*>(v); }
inline const rapidjson::Value* unview(const pulse_json_t* v) { return reinterpret_cast<const rapidjson::Value*>(v); }

// The message for a failed call: the plugin's own, or a note that it broke the contract.
std::string call_error(const pulse_call& call, pulse_status_t status, std::string_view plugin_id);

const char* status_name(pulse_status_t s);

}  // namespace pulse::host
