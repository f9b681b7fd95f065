/* Conformance plugin, plain C: a runtime controller whose `command` echoes its arguments.
 * Built twice (good_minimal, good_minimal_dup) to test duplicate-id rejection. */
#include <pulse/plugin.h>
#include <stdio.h>
#include <string.h>

#ifndef PLUGIN_ID
#define PLUGIN_ID "test.good-minimal"
#endif

static const pulse_host_api_t* g_host;
static int g_deinit_calls;

static pulse_status_t ctl_create(void* user, pulse_call_t* call, const pulse_json_t* config, void** out) {
    (void)user; (void)call; (void)config;
    *out = (void*)&g_deinit_calls;
    return PULSE_OK;
}
static void ctl_destroy(void* c) { (void)c; }
static pulse_status_t ctl_command(void* c, pulse_call_t* call, size_t argc, const pulse_str_t* argv,
                                  pulse_output_t* out, int32_t* exit_code) {
    (void)c; (void)call;
    g_host->output_write(out, (pulse_str_t){"args:", 5});
    for (size_t i = 0; i < argc; ++i) {
        g_host->output_write(out, (pulse_str_t){" ", 1});
        g_host->output_write(out, argv[i]);
    }
    g_host->output_write(out, (pulse_str_t){"\n", 1});
    *exit_code = (int32_t)argc;
    return PULSE_OK;
}

static const pulse_controller_vt_t k_ctl = {
    sizeof(pulse_controller_vt_t), "test-controller", ctl_create, ctl_destroy, ctl_command, NULL, NULL,
};

static pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    (void)call;
    g_host = host;
    *state = NULL;
    return host->register_controller(ctx, &k_ctl, sizeof k_ctl, NULL);
}
static void deinit(void* state) { (void)state; ++g_deinit_calls; }

static const pulse_plugin_info_t k_info = {
    sizeof(pulse_plugin_info_t), PULSE_ABI_MAJOR, PULSE_ABI_MINOR, 0, 0, 0, PULSE_KIND_CONTROLLER,
    PLUGIN_ID, "1.2.3", "conformance plugin (C)", NULL, init, deinit,
};

PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &k_info; }
