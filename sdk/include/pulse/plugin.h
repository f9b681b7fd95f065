/*
 * Pulse plugin ABI, version 1.
 *
 * This header IS the binary interface between the Pulse host and its plugins. It is plain C
 * (stdint/stddef/stdbool only) so that a plugin can be written in any language with a C FFI
 * and built by any compiler that follows the platform C ABI.
 *
 * Rules this header follows (docs/SDK.md has the long form):
 *   - Everything is prefixed `pulse_` / `PULSE_`; `_t` marks a typedef.
 *   - Every struct that crosses the boundary starts with `uint32_t struct_size` and is
 *     APPEND-ONLY within a major version. A field appended later has a safe zero value.
 *   - Enumerations are int32_t plus #defines (a C enum's size can vary with flags).
 *   - Strings are `pulse_str_t` views, UTF-8, NOT NUL-terminated, borrowed for the call.
 *   - The plugin exports exactly one symbol, `pulse_plugin_entry_v1`. Everything else travels
 *     as function tables in both directions.
 *   - Every function carries a thread annotation:
 *       [control]       only on the host's control thread (startup, reload, shutdown)
 *       [init-only]     a host service the plugin may call only inside its own init()
 *       [any-thread]    any host thread, concurrently; the callee synchronises itself
 *       [stream-serial] calls on one stream never overlap and come in order
 *   - Every type has OWNERSHIP and LIFETIME notes.
 *
 * Minor-version changelog (append a line for every addition):
 *   1.0  2026-11-29  initial ABI: info/entry, host API, JSON view + writer, translation
 *                    profile, backend and runtime-controller kinds, "pulse.metrics/1".
 *        2026-12-01  before the first outside release, no layout change: the info macros are
 *                    plain C (here, not only in plugin.hpp); PULSE_PLUGIN_UNLOAD_SAFE withdrawn
 *                    (flags are reserved); every comment says what a 1.0 host really does.
 *   1.1  2026-12-01  pulse_translation_vt_t.resume: continue a response on another endpoint
 *                    after its backend failed mid-stream (a 1.0 profile's responses fail there).
 *                    The policy kind (PULSE_KIND_POLICY, pulse_policy_vt_t, register_policy):
 *                    per-request reasoning budget, effort and sampling. request->annotate: a
 *                    profile says how it applied a request's reasoning budget.
 *   1.2  2026-12-04  pulse_backend_vt_t.budget_fields: the request fields capping reasoning
 *                    that an in-process backend enforces, so the host does not report a budget
 *                    as enforced by a field the backend ignores; annotate key
 *                    "reasoning_budget_field" names the field a profile wrote.
 *   1.3  2026-12-04  Token-exact resume. pulse_translation_vt_t.prepare: a preparatory request
 *                    the host sends before the request itself (e.g. llama-server's
 *                    /apply-template), its answer read back with request->prepared.
 *                    request->set_root_path: a path from the server's root, not the base URL.
 *                    delta->trail / delta->trail_lost: the generated token ids and the
 *                    backend's raw text, handed to resume as partial.trail.
 *   1.4  2026-12-05  A server's own dialect moves out of the host. pulse_translation_vt_t:
 *                    warm_request (the cheap replay of a served request that rebuilds the
 *                    server's prefix cache after a restart), cache_request / cache_answer (the
 *                    server's cache persistence: slot count, save, restore) and probe_answer
 *                    (what a health probe's answer means: ready, starting, down). PULSE_NOT_READY.
 *                    request->set_method (a GET for a server's status routes). A profile built
 *                    against 1.0-1.3 gets no warmup replays, no cache persistence and the
 *                    status-only probe (HTTP 200 = ready).
 */
#ifndef PULSE_PLUGIN_H
#define PULSE_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PULSE_ABI_MAJOR 1
#define PULSE_ABI_MINOR 4

/* A plugin may define PULSE_TARGET_ABI_MINOR before including this header to declare the
 * oldest host minor it runs on; it then must not use fields newer than that minor without
 * checking PULSE_HAS_FIELD on the host table. */
#ifndef PULSE_TARGET_ABI_MINOR
#define PULSE_TARGET_ABI_MINOR PULSE_ABI_MINOR
#endif

#if defined(_WIN32)
#define PULSE_EXPORT __declspec(dllexport)
#else
#define PULSE_EXPORT __attribute__((visibility("default")))
#endif

/* True when `field` lies inside the struct as the OTHER side compiled it. A present field that
 * is NULL means "not implemented". */
#define PULSE_HAS_FIELD(ptr, type, field) \
    (offsetof(type, field) + sizeof(((type*)0)->field) <= (size_t)(ptr)->struct_size)

/* ---------------------------------------------------------------------------------------- */
/* Basic types                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* A borrowed UTF-8 string view. NOT NUL-terminated.
 * OWNERSHIP: the side that passes it. LIFETIME: the call it is passed in. Copy to keep. */
typedef struct pulse_str {
    const char* ptr;
    size_t len;
} pulse_str_t;

/* Status codes. Fixed values: never renumber. Negative = error. */
typedef int32_t pulse_status_t;
#define PULSE_OK 0
#define PULSE_END 1     /* stream finished normally */
#define PULSE_TIMEOUT 2 /* nothing yet within the timeout; call again */
#define PULSE_NOT_READY 3 /* 1.4 probe_answer: the server is starting (loading its model): not ready, not failed */
/* What the client gets before any output (docs/SDK.md, "Status codes", is the whole table;
 * the test suite checks every row): */
#define PULSE_E_INVALID_ARGUMENT (-1)   /* the client's request is wrong          -> 400 invalid_request */
#define PULSE_E_UNSUPPORTED (-2)        /* not supported by this plugin           -> 400 invalid_request */
#define PULSE_E_UNAVAILABLE (-3)        /* transient; safe to retry elsewhere     -> failover, then 503 + Retry-After */
#define PULSE_E_RESOURCE_EXHAUSTED (-4) /* overloaded                             -> failover, then 503 + Retry-After */
#define PULSE_E_CANCELLED (-5)          /* cancelled                              -> nothing if the client left, else 502 */
#define PULSE_E_DEADLINE (-6)           /* call deadline passed                   -> 504 + Retry-After */
#define PULSE_E_INTERNAL (-7)           /* plugin bug                             -> 502 plugin_error, logged */
#define PULSE_E_ABI (-8)                /* version/struct mismatch at run time    -> 502 plugin_error */
#define PULSE_E_CONTEXT_LENGTH (-9)     /* prompt too long for the model          -> 400 context_length_exceeded */

/* Log levels. */
typedef int32_t pulse_log_level_t;
#define PULSE_LOG_TRACE 0
#define PULSE_LOG_DEBUG 1
#define PULSE_LOG_INFO 2
#define PULSE_LOG_WARN 3
#define PULSE_LOG_ERROR 4

/* Component kinds (bit flags in pulse_plugin_info_t.kinds). */
#define PULSE_KIND_TRANSLATION 0x1u /* Responses <-> upstream dialect; hot-reloadable */
#define PULSE_KIND_BACKEND 0x2u     /* in-process engine; startup only */
#define PULSE_KIND_CONTROLLER 0x4u  /* runtime controller (`pulse model`); startup only */
#define PULSE_KIND_POLICY 0x8u      /* per-request policy (1.1); startup only */

/* pulse_plugin_info_t.flags: none are defined in 1.x; set 0. A host ignores bits it does not
 * know. (Loaded code is never unloaded: a host keeps every copy it mapped until it exits.) */

/* ---------------------------------------------------------------------------------------- */
/* Opaque host handles                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* The plugin instance as the host sees it.
 * OWNERSHIP: host. LIFETIME: from init() until deinit() returns. The only long-lived handle. */
typedef struct pulse_host_ctx pulse_host_ctx_t;

/* One call from host to plugin: error slot, cancellation flag, deadline, request id, and the
 * documents json->parse made during it.
 * OWNERSHIP: host. LIFETIME: the call. Never retain; single-threaded. */
typedef struct pulse_call pulse_call_t;

/* A read-only view of a JSON value the host parsed. NULL means "absent".
 * OWNERSHIP: host. LIFETIME: the call. */
typedef struct pulse_json pulse_json_t;

/* A streaming JSON writer into a host buffer.
 * OWNERSHIP: host. LIFETIME: the call (or until the matching *_end call). */
typedef struct pulse_json_writer pulse_json_writer_t;

/* Where a translation profile writes normalized deltas (text, reasoning, tool calls, ...).
 * OWNERSHIP: host. LIFETIME: the call. */
typedef struct pulse_delta_sink pulse_delta_sink_t;

/* Where a backend writes upstream (Chat Completions) chunks.
 * OWNERSHIP: host. LIFETIME: the call. */
typedef struct pulse_chunk_sink pulse_chunk_sink_t;

/* The upstream HTTP request a translation profile builds (path, headers, body).
 * OWNERSHIP: host. LIFETIME: the call. */
typedef struct pulse_upstream_req pulse_upstream_req_t;

/* Text output of a controller command (what the CLI prints on stdout).
 * OWNERSHIP: host. LIFETIME: the call. */
typedef struct pulse_output pulse_output_t;

/* ---------------------------------------------------------------------------------------- */
/* JSON services                                                                            */
/* ---------------------------------------------------------------------------------------- */

typedef int32_t pulse_json_kind_t;
#define PULSE_JSON_NULL 0
#define PULSE_JSON_FALSE 1
#define PULSE_JSON_TRUE 2
#define PULSE_JSON_NUMBER 3
#define PULSE_JSON_STRING 4
#define PULSE_JSON_ARRAY 5
#define PULSE_JSON_OBJECT 6
#define PULSE_JSON_ABSENT 7 /* returned for a NULL view */

/* All functions [any-thread], but a view or writer is only used by one thread at a time. */
typedef struct pulse_json_api {
    uint32_t struct_size;

    /* ---- read-only views ---- */
    pulse_json_kind_t (*kind)(const pulse_json_t* v);
    /* Member of an object by key; NULL if `v` is not an object or has no such key. */
    const pulse_json_t* (*member)(const pulse_json_t* v, pulse_str_t key);
    /* Number of elements (array) or members (object); 0 otherwise. */
    size_t (*size)(const pulse_json_t* v);
    /* Array element i; NULL if out of range or not an array. */
    const pulse_json_t* (*at)(const pulse_json_t* v, size_t i);
    /* Object member i: returns the value and sets *key; NULL if out of range / not an object. */
    const pulse_json_t* (*member_at)(const pulse_json_t* v, size_t i, pulse_str_t* key);
    /* Scalar getters: false (and *out untouched) if the kind does not match.
     * get_i64 fails for non-integral or out-of-range numbers. */
    bool (*get_string)(const pulse_json_t* v, pulse_str_t* out);
    bool (*get_i64)(const pulse_json_t* v, int64_t* out);
    bool (*get_f64)(const pulse_json_t* v, double* out);
    bool (*get_bool)(const pulse_json_t* v, bool* out);

    /* ---- writer ----
     * The host checks each call against the JSON grammar. The first wrong one (a key outside an
     * object or twice in a row, a value where a key is due, an end that matches no open
     * container, a second top-level value, NaN or infinity, text that is not UTF-8, raw text
     * that is not JSON) returns false and puts the writer in error: every later call returns
     * false too. The reason becomes the error message of the call the writer belongs to (the
     * stream_next of a chunk writer, the build_request of a body, the health call of a health
     * writer) unless the plugin set one, so returning an error status reports it. */
    bool (*begin_object)(pulse_json_writer_t* w);
    bool (*end_object)(pulse_json_writer_t* w);
    bool (*begin_array)(pulse_json_writer_t* w);
    bool (*end_array)(pulse_json_writer_t* w);
    bool (*key)(pulse_json_writer_t* w, pulse_str_t k);
    bool (*string)(pulse_json_writer_t* w, pulse_str_t s);
    bool (*i64)(pulse_json_writer_t* w, int64_t x);
    bool (*f64)(pulse_json_writer_t* w, double x);
    bool (*boolean)(pulse_json_writer_t* w, bool b);
    bool (*null)(pulse_json_writer_t* w);
    /* A complete, valid JSON value as text; the host validates and copies it. */
    bool (*raw)(pulse_json_writer_t* w, pulse_str_t json);
    /* Copy a whole value from a view (e.g. pass a tool's JSON schema through). */
    bool (*copy)(pulse_json_writer_t* w, const pulse_json_t* v);
    /* Parse `text` into a host-owned document and hand out a view of it. The document lives
     * until the current call returns. NULL on invalid JSON; the reason ("invalid JSON: ... at
     * offset N") then becomes `call`'s error message, so an error status returned without
     * set_error reports it (set_error replaces it). Valid JSON with a number beyond a double's
     * range is not refused: that number reads as a string holding its text. */
    const pulse_json_t* (*parse)(pulse_call_t* call, pulse_str_t text);
    /* Compact JSON text of a view into buf (capacity cap, not NUL-terminated). Returns the full
     * length: call with cap 0 to size the buffer. */
    size_t (*serialize)(const pulse_json_t* v, char* buf, size_t cap);
} pulse_json_api_t;

/* ---------------------------------------------------------------------------------------- */
/* Normalized deltas (translation profile -> host)                                          */
/* ---------------------------------------------------------------------------------------- */

typedef int32_t pulse_finish_t;
#define PULSE_FINISH_STOP 0
#define PULSE_FINISH_LENGTH 1
#define PULSE_FINISH_TOOL_CALLS 2
#define PULSE_FINISH_CONTENT_FILTER 3

typedef int32_t pulse_tool_kind_t;
#define PULSE_TOOL_FUNCTION 0 /* a `function_call` item; arguments are a JSON string */
#define PULSE_TOOL_CUSTOM 1   /* a `custom_tool_call` item; input is raw text */

/* Why an upstream stream ended (translation stream_finish `how`). */
typedef int32_t pulse_stream_end_t;
#define PULSE_STREAM_CLEAN 0     /* terminal marker seen */
#define PULSE_STREAM_TRUNCATED 1 /* upstream died or timed out without its terminal marker */
#define PULSE_STREAM_CANCELLED 2 /* the client went away */

/* Token usage. Fields are -1 when unknown. */
typedef struct pulse_usage {
    uint32_t struct_size;
    int64_t input_tokens;  /* including cached */
    int64_t cached_tokens;
    int64_t output_tokens; /* including reasoning */
    int64_t reasoning_tokens;
} pulse_usage_t;

/* All functions [stream-serial] on the sink's stream; return PULSE_OK or an error status
 * (e.g. the profile broke the sequencing rules: a tool call index used before begin). */
typedef struct pulse_delta_api {
    uint32_t struct_size;
    pulse_status_t (*text)(pulse_delta_sink_t* s, pulse_str_t text);
    pulse_status_t (*reasoning)(pulse_delta_sink_t* s, pulse_str_t text);
    /* A tool call starts. `index` is the profile's own key for later fragments. `call_id` may be
     * empty (the host makes one up); `ns` is empty for tools without a namespace. */
    pulse_status_t (*tool_begin)(pulse_delta_sink_t* s, uint32_t index, pulse_tool_kind_t kind,
                                 pulse_str_t call_id, pulse_str_t name, pulse_str_t ns);
    pulse_status_t (*tool_args)(pulse_delta_sink_t* s, uint32_t index, pulse_str_t fragment);
    pulse_status_t (*tool_end)(pulse_delta_sink_t* s, uint32_t index);
    pulse_status_t (*finish)(pulse_delta_sink_t* s, pulse_finish_t reason);
    pulse_status_t (*usage)(pulse_delta_sink_t* s, const pulse_usage_t* u);
    /* The upstream reported an error inside the stream. */
    pulse_status_t (*error)(pulse_delta_sink_t* s, pulse_status_t status, pulse_str_t message);

    /* ---- 1.3 ---- */

    /* The backend's own record of this stream's output, for a token-exact resume: the token ids
     * it generated (`n` of them, in order) and its raw text for them (tags and text the
     * profile holds back included), appended to what earlier calls reported. The host keeps the
     * record of every attempt that reached the client and hands it to resume as
     * partial.trail = {"tokens": [...], "raw": "..."}. Report a chunk's trail after its deltas. */
    pulse_status_t (*trail)(pulse_delta_sink_t* s, const int32_t* tokens, size_t n, pulse_str_t raw);
    /* The record has a hole (the backend generated a token it did not report): the response
     * can then only be resumed by text; `why` is logged with the resume. */
    pulse_status_t (*trail_lost)(pulse_delta_sink_t* s, pulse_str_t why);
} pulse_delta_api_t;

/* ---------------------------------------------------------------------------------------- */
/* Upstream chunks (backend -> host) and upstream requests (profile -> host)                */
/* ---------------------------------------------------------------------------------------- */

/* [stream-serial] A backend emits each Chat Completions chunk as one SSE `data` payload, exactly
 * what an HTTP upstream would have sent. The terminal marker is implied by stream_next
 * returning PULSE_END. */
typedef struct pulse_chunk_api {
    uint32_t struct_size;
    pulse_status_t (*data)(pulse_chunk_sink_t* s, pulse_str_t payload);
    /* Or build the payload with the JSON writer: begin, write one value, end. */
    pulse_json_writer_t* (*begin)(pulse_chunk_sink_t* s);
    pulse_status_t (*end)(pulse_chunk_sink_t* s);
} pulse_chunk_api_t;

/* [any-thread, one request at a time] */
typedef struct pulse_request_api {
    uint32_t struct_size;
    /* Path relative to the endpoint base URL, e.g. "/chat/completions". */
    pulse_status_t (*set_path)(pulse_upstream_req_t* r, pulse_str_t path);
    pulse_status_t (*add_header)(pulse_upstream_req_t* r, pulse_str_t name, pulse_str_t value);
    /* The body writer: write exactly one JSON object. */
    pulse_json_writer_t* (*body)(pulse_upstream_req_t* r);

    /* ---- 1.1 ---- */

    /* Tells the host how this request was built, for what it reports to the client and logs.
     * Keys the host reads: "reasoning_budget" — how the request's reasoning budget
     * (request.reasoning.budget_tokens) was applied: "enforced by FIELD" when the backend caps
     * reasoning per request through that field, else "not enforced: WHY". A budget the profile
     * says nothing about is reported as not enforced. 1.2: "reasoning_budget_field" — FIELD
     * itself, so that an in-process backend that does not list it in budget_fields is reported
     * as not enforcing it. Copies both; last value per key wins. */
    pulse_status_t (*annotate)(pulse_upstream_req_t* r, pulse_str_t key, pulse_str_t value);

    /* ---- 1.3 ---- */

    /* A path from the server's root, whatever path the endpoint's base URL has (llama-server
     * serves /completion and /apply-template only there). Replaces set_path's. */
    pulse_status_t (*set_root_path)(pulse_upstream_req_t* r, pulse_str_t path);
    /* In build_request and resume: the JSON answer to the request `prepare` wrote (NULL when
     * the profile asked for none). Borrowed for the call. */
    const pulse_json_t* (*prepared)(pulse_upstream_req_t* r);

    /* ---- 1.4 ---- */

    /* The HTTP method, "POST" (the default) or "GET" (then no body is sent: write none). Only
     * for the requests of cache_request; a Responses request always goes out as a POST. */
    pulse_status_t (*set_method)(pulse_upstream_req_t* r, pulse_str_t method);
} pulse_request_api_t;

/* What cache_request asks a server to do with its prompt cache (1.4). */
typedef int32_t pulse_cache_op_t;
#define PULSE_CACHE_COUNT 0   /* how many cache slots it has (cache_answer's *out_count) */
#define PULSE_CACHE_SAVE 1    /* write slot `slot` to its file `name` */
#define PULSE_CACHE_RESTORE 2 /* load slot `slot` from its file `name` */

/* ---------------------------------------------------------------------------------------- */
/* Component vtables (plugin -> host, registered during init)                               */
/* ---------------------------------------------------------------------------------------- */

/* Translation profile: pure translator between the Responses API and one upstream dialect.
 * Hot-reloadable: it keeps no global mutable state; per-stream state lives in the stream.
 * OWNERSHIP: the plugin owns the vtable memory (static) and every `void*` it returns. */
typedef struct pulse_translation_vt {
    uint32_t struct_size;
    const char* name; /* what config refers to, e.g. "qwen38"; static */
    /* [control] One instance per model that uses this profile. `config` is the model's
     * [models.X.profile_options] table as JSON (may be NULL). Reject unknown keys. */
    pulse_status_t (*create)(void* user, pulse_call_t* call, const pulse_json_t* config,
                             void** out_instance);
    /* [control] */
    void (*destroy)(void* instance);
    /* [any-thread] Responses request -> upstream request. `model` is the model's JSON view
     * (name, upstream model name, sampling defaults). */
    pulse_status_t (*build_request)(void* instance, pulse_call_t* call, const pulse_json_t* request,
                                    const pulse_json_t* model, pulse_upstream_req_t* out);
    /* [any-thread] */
    pulse_status_t (*stream_open)(void* instance, pulse_call_t* call, const pulse_json_t* request,
                                  void** out_stream);
    /* [stream-serial] One upstream SSE event in (its `data` payload), zero or more deltas out. */
    pulse_status_t (*stream_feed)(void* stream, pulse_call_t* call, pulse_str_t data,
                                  pulse_delta_sink_t* sink);
    /* [stream-serial] The upstream ended; `how` says how. Flush buffered deltas here. */
    pulse_status_t (*stream_finish)(void* stream, pulse_call_t* call, pulse_stream_end_t how,
                                    pulse_delta_sink_t* sink);
    /* [stream-serial] Exactly once after a successful stream_open, whatever happened. */
    void (*stream_close)(void* stream);
    /* [any-thread] Optional. Classify an upstream HTTP error (status + body) and set a clear
     * message with set_error; return the status the host should act on (e.g. UNAVAILABLE for
     * failover, CONTEXT_LENGTH, INVALID_ARGUMENT). NULL: the host's generic mapping. */
    pulse_status_t (*map_error)(void* instance, pulse_call_t* call, int32_t http_status,
                                pulse_str_t body);

    /* ---- 1.1 ---- */

    /* [any-thread] Optional. Mid-stream resume: the backend serving `request` failed after
     * part of the answer reached the client, and the host continues the same response on
     * another endpoint. `partial` is what the client has received of the answer so far, a JSON
     * object {"text": string, "reasoning": string} (the output text and the reasoning text,
     * each in the order it was sent; either may be empty; never a tool call: a response that
     * showed one is not resumed; the host also gives "output_tokens" and "reasoning_tokens",
     * what the earlier attempts spent, and from 1.3 "trail" when every attempt reported a whole
     * one: see delta->trail). Write into `out`, as build_request does, a request that makes
     * a backend continue right after that output (for Chat Completions backends: the partial
     * answer as a trailing assistant message the server continues), and open in `*out_stream`
     * the stream that reads the answer (fed, finished and closed like one from stream_open; it
     * must emit only what follows the partial output: no repeat of it). Any error status: the
     * response is not resumed and fails as it would have. NULL: this profile cannot resume. */
    pulse_status_t (*resume)(void* instance, pulse_call_t* call, const pulse_json_t* request,
                             const pulse_json_t* model, const pulse_json_t* partial,
                             pulse_upstream_req_t* out, void** out_stream);

    /* ---- 1.3 ---- */

    /* [any-thread] Optional. Called before build_request: write into `out` a request (path and
     * JSON body, POSTed) whose answer build_request needs, or leave its path unset when this
     * request needs none. The host sends it, once per response, to the endpoint about to serve
     * the request (HTTP endpoints only: an in-process backend is not asked), fails over like
     * any request when that endpoint fails or answers a non-2xx, and hands the JSON answer to
     * build_request and resume through request->prepared. A resume on another endpoint reuses
     * it: it must depend on the model, not on the endpoint. NULL: never. */
    pulse_status_t (*prepare)(void* instance, pulse_call_t* call, const pulse_json_t* request,
                              const pulse_json_t* model, pulse_upstream_req_t* out);

    /* ---- 1.4 ---- */

    /* [any-thread] Optional. Prefix warmup. `sent` is a request this profile wrote that a
     * backend served: {"path": string, "root_path": bool, "body": object}, as the host sent it
     * (its set_path or set_root_path and its body). The host keeps the latest one of each
     * conversation, and when an endpoint comes back after being down it replays them, so that
     * the server's prefix cache holds each conversation before its next turn. Write into `out`
     * the request that makes the server read the same prompt at little cost (for example the
     * same body with max_tokens 1), or set no path: not replayed. The host reads the replay's
     * answer through stream_open (with an empty request object), stream_feed and
     * stream_finish, and uses only the usage it reports (input and cached tokens); it closes
     * the connection to cancel a replay when real traffic arrives, so a server that notices a
     * closed connection only between output chunks should be asked for progress chunks.
     * NULL: no replays. */
    pulse_status_t (*warm_request)(void* instance, pulse_call_t* call, const pulse_json_t* sent,
                                   pulse_upstream_req_t* out);
    /* [any-thread] Optional, with cache_answer. The server's own prompt-cache persistence,
     * which the host uses to keep an endpoint's cache across its restarts: it counts the slots
     * (PULSE_CACHE_COUNT) when the endpoint comes back, saves every slot (PULSE_CACHE_SAVE) at
     * most every warmup.slot_save_interval_s while the endpoint serves nothing, and restores
     * them (PULSE_CACHE_RESTORE) after a restart, before the replays. `name` is a plain file
     * name the host chose (letters, digits, '-', '_', '.'); `slot` counts from 0. Write into
     * `out` the request (path, method, body) or return PULSE_E_UNSUPPORTED: this server has no
     * such thing. NULL: no cache persistence. */
    pulse_status_t (*cache_request)(void* instance, pulse_call_t* call, pulse_cache_op_t op, int32_t slot,
                                    pulse_str_t name, pulse_upstream_req_t* out);
    /* [any-thread] Reads the answer (HTTP status and body) to a cache_request: PULSE_OK when the
     * server did it (PULSE_CACHE_COUNT: the number of slots in *out_count), PULSE_E_UNSUPPORTED
     * when this server cannot (e.g. it was started without the option that enables it: the host
     * stops asking this endpoint and logs set_error's message once), another error when it
     * failed this time (set_error says why). */
    pulse_status_t (*cache_answer)(void* instance, pulse_call_t* call, pulse_cache_op_t op, int32_t http_status,
                                   pulse_str_t body, int32_t* out_count);
    /* [any-thread] Optional. What the answer to the host's health probe (GET {base}/models) means:
     * PULSE_OK ready, PULSE_NOT_READY starting (e.g. still loading its model: requests wait for
     * it in the retry window instead of counting it as failed), an error status down; set_error
     * says why for either of the last two. Called for every answer, whatever its status; not
     * called when nothing answered. NULL: HTTP 200 is ready, anything else down. */
    pulse_status_t (*probe_answer)(void* instance, pulse_call_t* call, int32_t http_status, pulse_str_t body);
} pulse_translation_vt_t;

/* Backend: an in-process engine speaking the upstream dialect (Chat Completions request in,
 * chunks out). Startup only; never unloaded. */
typedef struct pulse_backend_vt {
    uint32_t struct_size;
    const char* name; /* what endpoints refer to: url = "plugin://NAME"; static */
    /* [control] `config` is the endpoint's options table as JSON (may be NULL). */
    pulse_status_t (*create)(void* user, pulse_call_t* call, const pulse_json_t* config,
                             void** out_backend);
    /* [control] All streams are closed. Join every thread you own here. */
    void (*destroy)(void* backend);
    /* [any-thread] `request` is the Chat Completions body the profile built. */
    pulse_status_t (*stream_start)(void* backend, pulse_call_t* call, const pulse_json_t* request,
                                   void** out_stream);
    /* [stream-serial] Wait up to timeout_ms (200) for a chunk. Returns PULSE_OK after emitting
     * >= 1 chunk, PULSE_TIMEOUT if nothing is ready yet, PULSE_END when finished (never before a
     * first chunk: that fails the endpoint), or an error. Called on a host thread of its own per
     * stream, again as soon as it returns; each chunk reaches the client as it is emitted. */
    pulse_status_t (*stream_next)(void* stream, pulse_call_t* call, uint32_t timeout_ms,
                                  pulse_chunk_sink_t* sink);
    /* [any-thread] Idempotent; makes a pending stream_next return PULSE_E_CANCELLED promptly.
     * May run concurrently with stream_next: set a flag and wake the waiter, nothing more. */
    void (*stream_cancel)(void* stream);
    /* [stream-serial] Exactly once after a successful stream_start. */
    void (*stream_close)(void* stream);
    /* [any-thread] Optional: write one JSON object describing health. PULSE_OK = healthy. */
    pulse_status_t (*health)(void* backend, pulse_call_t* call, pulse_json_writer_t* out);
    /* 1.2. Static, NULL-terminated: the request fields capping reasoning tokens that this
     * backend enforces ("thinking_token_budget", "reasoning_budget_tokens"); NULL = none. A
     * request's budget written into another field is reported "not enforced" for this backend. */
    const char* const* budget_fields;
} pulse_backend_vt_t;

/* Runtime controller: manages external runtimes (`pulse model ...`). Startup only. */
typedef struct pulse_controller_vt {
    uint32_t struct_size;
    const char* name; /* static */
    /* [control] `config` is the [controller] table as a JSON object, to which the host adds
     * "config_dir" (where relative paths start) and "gateway" {url, endpoint_fragments,
     * api_key}: how this site's gateway is reached and where it reads endpoint fragments. */
    pulse_status_t (*create)(void* user, pulse_call_t* call, const pulse_json_t* config,
                             void** out_controller);
    /* [control] */
    void (*destroy)(void* controller);
    /* [control] Run `pulse model ARGV...`. Text for the user goes to `out`; the process exit
     * code to *exit_code. Returns an error status only when the command could not run at all. */
    pulse_status_t (*command)(void* controller, pulse_call_t* call, size_t argc,
                              const pulse_str_t* argv, pulse_output_t* out, int32_t* exit_code);
    /* Reserved: a 1.x host never calls it; set NULL. (A controller publishes endpoints by
     * writing the gateway's endpoint fragments and asking it to reload: see the "gateway"
     * member of `config` above.) */
    pulse_status_t (*endpoints)(void* controller, pulse_call_t* call, pulse_json_writer_t* out);
    /* Reserved: a 1.x host never calls it; set NULL. */
    pulse_status_t (*health)(void* controller, pulse_call_t* call, pulse_json_writer_t* out);
} pulse_controller_vt_t;

/* Request policy (1.1): consulted once per request of a model that names it
 * ([models.X.policy]), after validation and before translation, to decide the request's
 * reasoning budget, reasoning effort and sampling. Startup only; never unloaded.
 * OWNERSHIP: the plugin owns the vtable memory (static) and every `void*` it returns. */
typedef struct pulse_policy_vt {
    uint32_t struct_size;
    const char* name; /* what config refers to: [models.X.policy] name = "NAME"; static */
    /* [control] One instance per model that uses it; `config` is [models.X.policy.options] as
     * JSON (may be NULL). Reject unknown keys. */
    pulse_status_t (*create)(void* user, pulse_call_t* call, const pulse_json_t* config,
                             void** out_policy);
    /* [control] No decide call is running. */
    void (*destroy)(void* policy);
    /* [any-thread, concurrently] `request` summarises the request: {"model", "effort" (the
     * client's reasoning effort, "" if none), "tools" (names), "history_items", "conversation"
     * (the routing key), "input_chars", "stream"}. Write one JSON object to `out` with any of
     * "reasoning_budget" (integer >= 0, reasoning tokens), "effort" ("none", "minimal", "low",
     * "medium", "high", "xhigh") and "sampling" {"temperature", "top_p", "top_k", "min_p",
     * "presence_penalty", "repetition_penalty", "max_output_tokens"}; `{}` changes nothing.
     * The host waits until call_deadline_ms (the model's policy timeout_ms) and then goes on
     * without the decision, marking the call cancelled: a slow policy checks call_cancelled.
     * An error status, a late answer, or an object the host cannot use (a wrong type, a value
     * out of range, an unknown key) leaves the request unchanged; the host logs and counts it.
     * The request never fails because of its policy. */
    pulse_status_t (*decide)(void* policy, pulse_call_t* call, const pulse_json_t* request,
                             pulse_json_writer_t* out);
} pulse_policy_vt_t;

/* ---------------------------------------------------------------------------------------- */
/* Host API (host -> plugin, passed to init)                                                */
/* ---------------------------------------------------------------------------------------- */

/* OWNERSHIP: host. LIFETIME: from init() until deinit() returns. Append-only. */
typedef struct pulse_host_api {
    uint32_t struct_size;
    uint16_t abi_major; /* the host's version */
    uint16_t abi_minor;

    /* memory [any-thread]: the host's allocator (aligned_alloc / free). Unused: no call up to
     * 1.3 hands a buffer across the boundary (every host writer and sink copies at once), so
     * no plugin needs them. They stay in the layout, and working, for any plugin that calls
     * them. */
    void* (*alloc)(size_t size, size_t align);
    void (*free)(void* p);

    /* logging [any-thread, also from plugin-owned threads]: the host adds time, plugin id,
     * generation and the call's request id. `call` may be NULL. */
    bool (*log_enabled)(pulse_host_ctx_t* ctx, pulse_log_level_t level);
    void (*log)(pulse_host_ctx_t* ctx, pulse_call_t* call, pulse_log_level_t level, pulse_str_t msg);

    /* errors [the call's thread]: copies msg; returns `status` so plugins can tail-call it. */
    pulse_status_t (*set_error)(pulse_call_t* call, pulse_status_t status, pulse_str_t msg);

    /* cancellation and deadlines [the call's thread] */
    bool (*call_cancelled)(pulse_call_t* call);
    /* CLOCK_MONOTONIC milliseconds at which the host stops waiting; 0 = none. Set for a
     * backend's stream_start and stream_next: until the stream's first chunk, the request's
     * head deadline (upstream.head_timeout_s after stream_start began); after it, the idle
     * deadline (upstream.idle_timeout_s after the last chunk). Past it the host cancels the
     * stream, closes it and fails over. A policy's decide: the model's policy timeout_ms after
     * the call began. Every other call: 0. */
    uint64_t (*call_deadline_ms)(pulse_call_t* call);
    /* The request id for logs (e.g. "resp_..."); empty outside a request. */
    pulse_str_t (*call_request_id)(pulse_call_t* call);

    /* registration [init-only]: the host copies min(vt_size, host's size) bytes. `user` is
     * passed back as the first argument of create(). */
    pulse_status_t (*register_translation)(pulse_host_ctx_t* ctx, const pulse_translation_vt_t* vt,
                                           uint32_t vt_size, void* user);
    pulse_status_t (*register_backend)(pulse_host_ctx_t* ctx, const pulse_backend_vt_t* vt,
                                       uint32_t vt_size, void* user);
    pulse_status_t (*register_controller)(pulse_host_ctx_t* ctx, const pulse_controller_vt_t* vt,
                                          uint32_t vt_size, void* user);

    /* service tables, each with its own struct_size */
    const pulse_json_api_t* json;
    const pulse_delta_api_t* delta;
    const pulse_chunk_api_t* chunk;
    const pulse_request_api_t* request;

    /* controller output [the call's thread] */
    pulse_status_t (*output_write)(pulse_output_t* out, pulse_str_t text);

    /* optional services by versioned id ("pulse.metrics/1"); NULL if absent [any-thread] */
    const void* (*get_extension)(pulse_host_ctx_t* ctx, const char* id);

    /* ---- 1.1 (check PULSE_HAS_FIELD on a host older than your build) ---- */

    /* registration [init-only], as register_translation. */
    pulse_status_t (*register_policy)(pulse_host_ctx_t* ctx, const pulse_policy_vt_t* vt,
                                      uint32_t vt_size, void* user);
} pulse_host_api_t;

/* ---------------------------------------------------------------------------------------- */
/* Optional services (host->get_extension)                                                  */
/* ---------------------------------------------------------------------------------------- */

/* "pulse.metrics/1": plugin counters in the host's /metrics. The host adds a plugin="<id>"
 * label. Names are [a-zA-Z_:][a-zA-Z0-9_:]* and should end in _total; others are dropped.
 * OWNERSHIP: host (static). LIFETIME: process. */
#define PULSE_EXT_METRICS "pulse.metrics/1"
typedef struct pulse_metrics_ext {
    uint32_t struct_size;
    /* [any-thread] Adds `delta` to counter `name`, with one optional label (empty name = none). */
    void (*counter_add)(pulse_host_ctx_t* ctx, pulse_str_t name, pulse_str_t label, pulse_str_t label_value,
                        uint64_t delta);
} pulse_metrics_ext_t;

/* ---------------------------------------------------------------------------------------- */
/* The entry point                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Returned by the entry. Static, side-effect free: the host reads it before running any other
 * plugin code. OWNERSHIP: plugin (static storage). LIFETIME: while the library is mapped. */
typedef struct pulse_plugin_info {
    uint32_t struct_size;        /* sizeof as compiled into the plugin */
    uint16_t abi_major;          /* must equal the host's PULSE_ABI_MAJOR */
    uint16_t abi_minor_built;    /* the SDK minor the plugin was compiled against */
    uint16_t abi_minor_required; /* the lowest host minor the plugin runs on */
    uint16_t reserved;           /* must be 0 */
    uint32_t flags;              /* reserved: 0 (see above) */
    uint32_t kinds;              /* PULSE_KIND_* bits: what init() will register */
    const char* id;              /* unique, [a-z0-9._-]+, e.g. "pulse.translation.qwen38" */
    const char* version;         /* the plugin's own semver */
    const char* build_info;      /* compiler, stdlib, ...: diagnostics only */
    /* Optional [control]: cheap "can I run here?". Return false and explain with `why` (the
     * host copies it). Side-effect free. */
    bool (*probe)(const pulse_host_api_t* host, pulse_str_t* why);
    /* [control] Register components through `host`. On failure call host->set_error(call,...)
     * and return an error status. `*out_state` is passed back to deinit. */
    pulse_status_t (*init)(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call,
                           void** out_state);
    /* [control] Exactly once after a successful init, never after a failed one: at shutdown
     * (reverse load order), or when a replaced translation-profile copy has served its last
     * stream, or when the host refuses what init registered. Free `state` here: it runs after
     * every instance this plugin created was destroyed and every stream closed, so destroy and
     * stream_close may still use what deinit frees. */
    void (*deinit)(void* state);
} pulse_plugin_info_t;

/* The leading fields of a pulse_plugin_info_t built against this header, and a build
 * description, in C and C++ alike:
 *
 *     static const pulse_plugin_info_t k_info = {
 *         PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_BACKEND, "vendor.backend.mine", "1.0.0"),
 *         PULSE_BUILD_INFO, NULL, init, deinit,   (build_info, probe, init, deinit)
 *     };
 */
#define PULSE_PLUGIN_INFO_HEAD(kinds_, id_, version_)                                     \
    sizeof(pulse_plugin_info_t), PULSE_ABI_MAJOR, PULSE_ABI_MINOR, PULSE_TARGET_ABI_MINOR, \
        0, 0, (kinds_), (id_), (version_)

#define PULSE_STRINGIFY_(x) PULSE_STRINGIFY2_(x)
#define PULSE_STRINGIFY2_(x) #x
#if defined(__VERSION__)
#define PULSE_COMPILER_ "cc " __VERSION__
#else
#define PULSE_COMPILER_ "cc unknown"
#endif
#if defined(__cplusplus)
#define PULSE_BUILD_INFO PULSE_COMPILER_ ", C++ " PULSE_STRINGIFY_(__cplusplus)
#elif defined(__STDC_VERSION__)
#define PULSE_BUILD_INFO PULSE_COMPILER_ ", C " PULSE_STRINGIFY_(__STDC_VERSION__)
#else
#define PULSE_BUILD_INFO PULSE_COMPILER_ ", C89"
#endif

/* The one exported symbol. The major version is part of its name. */
typedef const pulse_plugin_info_t* (*pulse_plugin_entry_v1_fn)(void);
#define PULSE_PLUGIN_ENTRY_SYMBOL "pulse_plugin_entry_v1"

#ifdef __cplusplus
}
#endif

#endif /* PULSE_PLUGIN_H */
