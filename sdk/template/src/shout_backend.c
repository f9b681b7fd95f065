/* Example backend plugin in plain C for the Pulse SDK: "example-shout".
 *
 * A backend receives the Chat Completions request body its model's translation profile built
 * and answers with Chat Completions stream chunks, as an HTTP server would send them. This one
 * answers every request with the last user message in capitals, a word per chunk, then the
 * finish chunk and the usage chunk (`choices: []`), exactly as vLLM streams. It needs no
 * threads: each stream_next emits the next chunk at once. Use it as the template for a C engine.
 *
 * Build it out of tree with nothing but the installed SDK: this project's meson.build
 * (`meson setup build && meson test -C build`), or a plain compiler line:
 *   cc -std=c11 -shared -fPIC $(pkg-config --cflags pulse-sdk) $(pkg-config --variable=plugin_cflags pulse-sdk) shout_backend.c \
 *      $(pkg-config --libs pulse-sdk) -o example_shout.so
 *
 * Serve it (pulse.toml):
 *   [models.shout]
 *   profile = "qwen38"                 # any translation profile: it builds the request
 *   [[models.shout.endpoints]]
 *   url = "plugin://example-shout"     # the vtable's name below, not the plugin id
 *   options = { words_per_chunk = 2 }  # the endpoint's options reach create() as JSON
 */
#include <pulse/plugin.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const pulse_host_api_t* g_host;

static pulse_str_t str(const char* s) {
    pulse_str_t v = {s, strlen(s)};
    return v;
}

typedef struct backend {
    int64_t words_per_chunk;
} backend_t;

typedef struct stream {
    char* text;        /* the answer, owned */
    size_t pos, len;   /* next byte to send */
    int64_t per_chunk; /* words per chunk */
    int64_t prompt_words, chunks_sent;
    int phase;         /* 0 role, 1 text, 2 finish, 3 usage, 4 done */
    char model[128];
    atomic_bool cancelled;
} stream_t;

/* ---- create / destroy: one backend per endpoint, with the endpoint's options ---- */

static pulse_status_t create(void* user, pulse_call_t* call, const pulse_json_t* config, void** out) {
    (void)user;
    const pulse_json_api_t* j = g_host->json;
    backend_t* b = calloc(1, sizeof *b);
    if (!b) return g_host->set_error(call, PULSE_E_RESOURCE_EXHAUSTED, str("example-shout: out of memory"));
    b->words_per_chunk = 1;
    for (size_t i = 0; i < j->size(config); ++i) { /* size() of NULL (no options) is 0 */
        pulse_str_t key;
        const pulse_json_t* v = j->member_at(config, i, &key);
        if (key.len == 15 && memcmp(key.ptr, "words_per_chunk", 15) == 0 && j->get_i64(v, &b->words_per_chunk) &&
            b->words_per_chunk > 0)
            continue;
        free(b);
        return g_host->set_error(call, PULSE_E_INVALID_ARGUMENT,
                                 str("example-shout: unknown or mistyped option (allowed: words_per_chunk, an integer > 0)"));
    }
    *out = b;
    return PULSE_OK;
}

static void destroy(void* b) { free(b); }

/* ---- a stream per request ---- */

static void count_words(const char* p, size_t n, int64_t* words) {
    int in_word = 0;
    for (size_t i = 0; i < n; ++i) {
        int space = p[i] == ' ' || p[i] == '\n' || p[i] == '\t';
        if (!space && !in_word) ++*words;
        in_word = !space;
    }
}

static pulse_status_t stream_start(void* backend, pulse_call_t* call, const pulse_json_t* request, void** out) {
    const pulse_json_api_t* j = g_host->json;
    const backend_t* b = backend;
    const pulse_json_t* messages = j->member(request, str("messages"));
    if (j->kind(messages) != PULSE_JSON_ARRAY || j->size(messages) == 0)
        return g_host->set_error(call, PULSE_E_INVALID_ARGUMENT, str("example-shout: the request has no messages"));
    pulse_str_t last = {"", 0};
    int64_t words = 0;
    for (size_t i = 0; i < j->size(messages); ++i) {
        const pulse_json_t* m = j->at(messages, i);
        pulse_str_t role = {"", 0}, text = {"", 0};
        j->get_string(j->member(m, str("role")), &role);
        if (!j->get_string(j->member(m, str("content")), &text)) continue; /* parts arrays: skipped here */
        count_words(text.ptr, text.len, &words);
        if (role.len == 4 && memcmp(role.ptr, "user", 4) == 0) last = text;
    }
    stream_t* s = calloc(1, sizeof *s);
    if (!s || !(s->text = malloc(last.len + 1))) {
        free(s);
        return g_host->set_error(call, PULSE_E_RESOURCE_EXHAUSTED, str("example-shout: out of memory"));
    }
    for (size_t i = 0; i < last.len; ++i) {
        char c = last.ptr[i];
        s->text[i] = (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : c;
    }
    s->len = last.len;
    s->per_chunk = b->words_per_chunk;
    s->prompt_words = words;
    pulse_str_t model = {"example-shout", 13};
    j->get_string(j->member(request, str("model")), &model);
    size_t n = model.len < sizeof s->model - 1 ? model.len : sizeof s->model - 1;
    memcpy(s->model, model.ptr, n);
    atomic_init(&s->cancelled, false);
    *out = s;
    return PULSE_OK;
}

/* key + value, for the chunks below. */
static void kv_string(pulse_json_writer_t* w, const char* k, pulse_str_t v) {
    g_host->json->key(w, str(k));
    g_host->json->string(w, v);
}
static void kv_i64(pulse_json_writer_t* w, const char* k, int64_t v) {
    g_host->json->key(w, str(k));
    g_host->json->i64(w, v);
}

/* Writes {"id":..,"object":"chat.completion.chunk","created":0,"model":..,"choices":[...]} with the
 * host's JSON writer; `delta_text` NULL = no content; `finish` NULL = null. */
static pulse_status_t emit(stream_t* s, pulse_chunk_sink_t* sink, const char* role, const char* delta_text, size_t delta_len,
                           const char* finish) {
    const pulse_json_api_t* j = g_host->json;
    pulse_json_writer_t* w = g_host->chunk->begin(sink);
    j->begin_object(w);
    kv_string(w, "id", str("chatcmpl-shout"));
    kv_string(w, "object", str("chat.completion.chunk"));
    kv_i64(w, "created", 0);
    kv_string(w, "model", str(s->model));
    j->key(w, str("choices"));
    j->begin_array(w);
    j->begin_object(w);
    kv_i64(w, "index", 0);
    j->key(w, str("delta"));
    j->begin_object(w);
    if (role) kv_string(w, "role", str(role));
    if (delta_text) {
        pulse_str_t t = {delta_text, delta_len};
        kv_string(w, "content", t);
    }
    j->end_object(w);
    j->key(w, str("finish_reason"));
    if (finish) j->string(w, str(finish));
    else j->null(w);
    j->end_object(w);
    j->end_array(w);
    j->end_object(w);
    /* One check at the end is enough: after a wrong call every later one fails, and end()
     * refuses an incomplete value, with the reason in this call's error. */
    return g_host->chunk->end(sink);
}

/* The usage chunk vLLM sends last: no choices, token counts (here: words). */
static pulse_status_t emit_usage(stream_t* s, pulse_chunk_sink_t* sink) {
    const pulse_json_api_t* j = g_host->json;
    pulse_json_writer_t* w = g_host->chunk->begin(sink);
    j->begin_object(w);
    kv_string(w, "id", str("chatcmpl-shout"));
    kv_string(w, "object", str("chat.completion.chunk"));
    kv_string(w, "model", str(s->model));
    j->key(w, str("choices"));
    j->begin_array(w);
    j->end_array(w);
    j->key(w, str("usage"));
    j->begin_object(w);
    kv_i64(w, "prompt_tokens", s->prompt_words);
    kv_i64(w, "completion_tokens", s->chunks_sent);
    kv_i64(w, "total_tokens", s->prompt_words + s->chunks_sent);
    j->end_object(w);
    j->end_object(w);
    return g_host->chunk->end(sink);
}

static pulse_status_t stream_next(void* stream, pulse_call_t* call, uint32_t timeout_ms, pulse_chunk_sink_t* sink) {
    (void)timeout_ms; /* every chunk is ready at once: never PULSE_TIMEOUT */
    stream_t* s = stream;
    if (atomic_load(&s->cancelled) || g_host->call_cancelled(call))
        return g_host->set_error(call, PULSE_E_CANCELLED, str("example-shout: cancelled"));
    switch (s->phase) {
        case 0:
            s->phase = s->len ? 1 : 2;
            return emit(s, sink, "assistant", "", 0, NULL);
        case 1: {
            size_t start = s->pos;
            for (int64_t w = 0; w < s->per_chunk && s->pos < s->len; ++w) {
                while (s->pos < s->len && s->text[s->pos] != ' ') ++s->pos;
                while (s->pos < s->len && s->text[s->pos] == ' ') ++s->pos;
            }
            if (s->pos >= s->len) s->phase = 2;
            ++s->chunks_sent;
            return emit(s, sink, NULL, s->text + start, s->pos - start, NULL);
        }
        case 2:
            s->phase = 3;
            return emit(s, sink, NULL, NULL, 0, "stop");
        case 3:
            s->phase = 4;
            return emit_usage(s, sink);
        default:
            return PULSE_END;
    }
}

/* Any thread, concurrently with stream_next: only set the flag. */
static void stream_cancel(void* stream) { atomic_store(&((stream_t*)stream)->cancelled, true); }

static void stream_close(void* stream) {
    stream_t* s = stream;
    free(s->text);
    free(s);
}

static const pulse_backend_vt_t k_backend = {
    sizeof(pulse_backend_vt_t), "example-shout", create, destroy, stream_start, stream_next, stream_cancel, stream_close,
    NULL, /* health: optional */
    NULL, /* budget_fields: no reasoning, so no budget field is enforced (ABI 1.2) */
};

/* ---- the plugin ---- */

static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)call;
    g_host = host;
    *state = NULL;
    return host->register_backend(ctx, &k_backend, sizeof k_backend, NULL);
}

static void deinit(void* state) { (void)state; }

static const pulse_plugin_info_t k_info = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_BACKEND, "pulse.example.shout", "1.0.0"),
    PULSE_BUILD_INFO, NULL, init, deinit,
};

PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &k_info; }
