/* Deliberately broken conformance plugins. One source, one variant per -DVARIANT_* define, so
 * each broken shape is exactly one difference from a good plugin. */
#include <pulse/plugin.h>
#include <string.h>

#if !defined(VARIANT_DEINIT_LOG)
static void deinit(void* s) { (void)s; }
#endif

#if defined(VARIANT_INIT_FAILS_WITH_MESSAGE)
static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)ctx; (void)state;
    const char* msg = "model directory /nonexistent is missing";
    return host->set_error(call, PULSE_E_UNAVAILABLE, (pulse_str_t){msg, strlen(msg)});
}
#define ID "test.init-fails-with-message"
#elif defined(VARIANT_INIT_FAILS_WITHOUT_MESSAGE)
static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)host; (void)ctx; (void)call; (void)state;
    return PULSE_E_INTERNAL;
}
#define ID "test.init-fails-without-message"
#elif defined(VARIANT_REGISTERS_UNDECLARED_KIND)
static pulse_status_t b_create(void* u, pulse_call_t* c, const pulse_json_t* j, void** o) { (void)u; (void)c; (void)j; *o = NULL; return PULSE_OK; }
static const pulse_backend_vt_t k_backend = {sizeof(pulse_backend_vt_t), "sneaky", b_create, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)call;
    *state = NULL;
    host->register_backend(ctx, &k_backend, sizeof k_backend, NULL);
    return PULSE_OK;
}
#define ID "test.registers-undeclared-kind"
#elif defined(VARIANT_PASSES_ON_REFUSAL)
/* What most authors write: init returns what a refused register_* call returned. */
static pulse_status_t b_create(void* u, pulse_call_t* c, const pulse_json_t* j, void** o) { (void)u; (void)c; (void)j; *o = NULL; return PULSE_OK; }
static const pulse_backend_vt_t k_backend = {sizeof(pulse_backend_vt_t), "sneaky", b_create, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)call;
    *state = NULL;
    return host->register_backend(ctx, &k_backend, sizeof k_backend, NULL);
}
#define ID "test.passes-on-refusal"
#elif defined(VARIANT_UNDEFINED_SYMBOL)
/* Linked without -z defs: the loader, not the linker, finds the hole. */
extern int pulse_test_symbol_nobody_defines(void);
static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)host; (void)ctx; (void)call;
    *state = NULL;
    return pulse_test_symbol_nobody_defines() ? PULSE_OK : PULSE_E_INTERNAL;
}
#define ID "test.undefined-symbol"
#elif defined(VARIANT_DEINIT_LOG)
/* Owns heap state and frees it in deinit, as a naive plugin would: a second deinit would be a
 * double free. Each deinit appends a line to $PULSE_TEST_DEINIT_LOG. */
#include <stdio.h>
#include <stdlib.h>
static void deinit_logged(void* s) {
    const char* path = getenv("PULSE_TEST_DEINIT_LOG");
    FILE* f = path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "deinit %s\n", (const char*)s);
        fclose(f);
    }
    free(s);
}
static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)host; (void)ctx; (void)call;
    char* s = (char*)malloc(16);
    if (!s) return PULSE_E_RESOURCE_EXHAUSTED;
    strcpy(s, "state");
    *state = s;
    return PULSE_OK;
}
#define deinit deinit_logged
#define ID "test.deinit-log"
#else
static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)host; (void)ctx; (void)call;
    *state = NULL;
    return PULSE_OK;
}
#endif

#if !defined(ID)
#if defined(VARIANT_NEEDS_NEWER_MINOR)
#define ID "test.needs-newer-minor"
#elif defined(VARIANT_PROBE_RETURNS_ZERO)
#define ID "test.probe-returns-zero"
#elif defined(VARIANT_BAD_ID)
#define ID "Bad ID!"
#else
#define ID "test.broken"
#endif
#endif

#if defined(VARIANT_PROBE_RETURNS_ZERO)
static bool probe(const pulse_host_api_t* host, pulse_str_t* why) {
    (void)host;
    static const char k[] = "no CUDA driver found";
    why->ptr = k;
    why->len = sizeof k - 1;
    return false;
}
#else
#define probe NULL
#endif

#if defined(VARIANT_NEEDS_NEWER_MINOR)
#define MINOR_BUILT 99
#define MINOR_REQUIRED 99
#else
#define MINOR_BUILT PULSE_ABI_MINOR
#define MINOR_REQUIRED 0
#endif

static const pulse_plugin_info_t k_info = {
    sizeof(pulse_plugin_info_t), PULSE_ABI_MAJOR, MINOR_BUILT, MINOR_REQUIRED, 0, 0, PULSE_KIND_CONTROLLER,
    ID, "0.0.1", "conformance plugin (broken)", probe, init, deinit,
};

#if defined(VARIANT_ENTRY_V2_ONLY)
PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v2(void) { return &k_info; }
#elif defined(VARIANT_MISSING_ENTRY)
PULSE_EXPORT int some_other_function(void) { return (int)k_info.struct_size; }
#else
PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &k_info; }
#endif
