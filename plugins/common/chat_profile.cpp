#include "chat_profile.h"

#include <memory>

namespace pulse::chat {
namespace {

const pulse_host_api_t* g_host = nullptr;
pulse_host_ctx_t* g_ctx = nullptr;
const pulse_metrics_ext_t* g_metrics = nullptr;  // optional host service

struct Profile {
    Options options;
    Log log;
};

struct Stream {
    ChunkTranslator translator;
};

// Tells the host how the request's reasoning budget was applied (a 1.0 host has no annotate).
void annotate_budget(const Options& o, const Json& req, pulse_upstream_req_t* out) {
    if (!PULSE_HAS_FIELD(g_host->request, pulse_request_api_t, annotate)) return;
    if (auto note = budget_note(o, req)) {
        g_host->request->annotate(out, str("reasoning_budget"), str(*note));
        // The field itself (1.2), so the host can ask an in-process backend whether it honours it.
        if (note->rfind("enforced by ", 0) == 0 && o.budget_field)
            g_host->request->annotate(out, str("reasoning_budget_field"), str(*o.budget_field));
    }
}

}  // namespace

void bind_host(const pulse_host_api_t* host, pulse_host_ctx_t* ctx) {
    g_host = host;
    g_ctx = ctx;
    g_metrics = static_cast<const pulse_metrics_ext_t*>(host->get_extension(ctx, PULSE_EXT_METRICS));
    if (g_metrics && !PULSE_HAS_FIELD(g_metrics, pulse_metrics_ext_t, counter_add)) g_metrics = nullptr;
}

pulse_status_t profile_create(void* dialect, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return guard(g_host, call, [&] {
        const auto& d = *static_cast<const Dialect*>(dialect);
        auto p = std::make_unique<Profile>();
        Json cfg(g_host->json, config);
        p->options = Options::parse(cfg, d.name);
        if (d.adjust) d.adjust(p->options, cfg);
        p->log = Log(g_host, g_ctx);
        *out = p.release();
        return PULSE_OK;
    });
}

void profile_destroy(void* instance) { delete static_cast<Profile*>(instance); }

// The server's rendered prompt for this request (prepare's answer), when the request goes out as
// a raw completion (Options::token_resume); else nullopt and the request is a chat one.
std::optional<Json> rendered_prompt(const Profile& p, const Json& req, const RequestInfo& info, pulse_upstream_req_t* out) {
    if (!raw_eligible(p.options, req, info) || !PULSE_HAS_FIELD(g_host->request, pulse_request_api_t, prepared)) return std::nullopt;
    Json prepared(g_host->json, g_host->request->prepared(out));
    if (!has_rendered_prompt(p.options, prepared)) return std::nullopt;
    return prepared;
}

pulse_status_t profile_prepare(void* instance, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                               pulse_upstream_req_t* out) {
    return guard(g_host, call, [&] {
        auto& p = *static_cast<Profile*>(instance);
        Json req(g_host->json, request);
        auto info = request_info(p.options, req);
        if (!raw_eligible(p.options, req, info) || !PULSE_HAS_FIELD(g_host->request, pulse_request_api_t, set_root_path))
            return PULSE_OK;  // a chat request: nothing to ask first
        // The server renders the chat request it would have served.
        Writer w(g_host->json, g_host->request->body(out));
        write_render_request(g_host, call, p.options, req, Json(g_host->json, model), info, w, p.log);
        g_host->request->set_root_path(out, str(render_path(p.options)));
        return PULSE_OK;
    });
}

pulse_status_t profile_build_request(void* instance, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                                     pulse_upstream_req_t* out) {
    return guard(g_host, call, [&] {
        auto& p = *static_cast<Profile*>(instance);
        Json req(g_host->json, request);
        auto info = request_info(p.options, req);
        if (auto prompt = rendered_prompt(p, req, info, out)) {
            Writer w(g_host->json, g_host->request->body(out));
            write_raw_request(p.options, req, Json(g_host->json, model), *prompt, nullptr, w);
            g_host->request->set_path(out, str("/completions"));
            return PULSE_OK;
        }
        for (const auto& t : info.dropped_tools) {
            p.log(PULSE_LOG_INFO, "dropped tool of type '" + t + "': the backend cannot run hosted tools", call);
            if (g_metrics) g_metrics->counter_add(g_ctx, str("pulse_tools_dropped_total"), str("type"), str(t), 1);
        }
        Writer w(g_host->json, g_host->request->body(out));
        write_request(g_host, call, p.options, req, Json(g_host->json, model), info, w, p.log);
        g_host->request->set_path(out, str("/chat/completions"));
        annotate_budget(p.options, req, out);
        return PULSE_OK;
    });
}

pulse_status_t profile_stream_open(void* instance, pulse_call_t* call, const pulse_json_t* request, void** out) {
    return guard(g_host, call, [&] {
        auto& p = *static_cast<Profile*>(instance);
        *out = new Stream{ChunkTranslator(g_host, request_info(p.options, Json(g_host->json, request)))};
        return PULSE_OK;
    });
}

pulse_status_t profile_resume(void* instance, pulse_call_t* call, const pulse_json_t* request, const pulse_json_t* model,
                              const pulse_json_t* partial, pulse_upstream_req_t* out, void** out_stream) {
    return guard(g_host, call, [&] {
        auto& p = *static_cast<Profile*>(instance);
        Json req(g_host->json, request);
        Json part(g_host->json, partial);
        Partial resume{std::string(part["text"].string_or("")), std::string(part["reasoning"].string_or("")),
                       part["output_tokens"].i64().value_or(0), part["reasoning_tokens"].i64().value_or(0), {}, {}};
        auto info = request_info(p.options, req);
        Json trail = part["trail"];
        if (auto prompt = rendered_prompt(p, req, info, out); prompt && trail["tokens"].size() > 0) {
            // By tokens: the rendered prompt and every id generated so far; the stream's parser
            // resumes where the failed one stood.
            for (size_t i = 0; i < trail["tokens"].size(); ++i) resume.tokens.push_back(static_cast<int32_t>(trail["tokens"].at(i).i64().value_or(-1)));
            resume.raw = std::string(trail["raw"].string_or(""));
            Writer w(g_host->json, g_host->request->body(out));
            write_raw_request(p.options, req, Json(g_host->json, model), *prompt, &resume, w);
            g_host->request->set_path(out, str("/completions"));
            g_host->request->annotate(out, str("resume"), str("by tokens (" + std::to_string(resume.tokens.size()) + " generated ids after the rendered prompt)"));
            auto stream = std::make_unique<Stream>(Stream{ChunkTranslator(g_host, std::move(info))});
            stream->translator.continue_raw(resume);
            *out_stream = stream.release();
            return PULSE_OK;
        }
        // With no record the host says why; with one, why it is not used.
        if (trail["tokens"].size() > 0 && PULSE_HAS_FIELD(g_host->request, pulse_request_api_t, annotate))
            g_host->request->annotate(out, str("resume"), str(!raw_eligible(p.options, req, info)
                                                                  ? "by text (this request needs the server's chat handling: a forced tool, a JSON schema, an image or a reasoning budget)"
                                                                  : "by text (the server's rendered prompt is missing)"));
        Writer w(g_host->json, g_host->request->body(out));
        write_request(g_host, call, p.options, req, Json(g_host->json, model), info, w, p.log, &resume);
        g_host->request->set_path(out, str("/chat/completions"));
        annotate_budget(p.options, req, out);
        auto stream = std::make_unique<Stream>(Stream{ChunkTranslator(g_host, std::move(info))});
        stream->translator.expect_echo(resume);
        *out_stream = stream.release();
        return PULSE_OK;
    });
}

pulse_status_t profile_stream_feed(void* stream, pulse_call_t* call, pulse_str_t data, pulse_delta_sink_t* sink) {
    return guard(g_host, call, [&] { return static_cast<Stream*>(stream)->translator.feed(call, view(data), sink); });
}

pulse_status_t profile_stream_finish(void* stream, pulse_call_t* call, pulse_stream_end_t how, pulse_delta_sink_t* sink) {
    return guard(g_host, call, [&] { return static_cast<Stream*>(stream)->translator.finish(call, how, sink); });
}

void profile_stream_close(void* stream) { delete static_cast<Stream*>(stream); }

pulse_status_t profile_map_error(void*, pulse_call_t* call, int32_t status, pulse_str_t body) {
    return guard(g_host, call, [&] { return map_http_error(g_host, call, status, view(body)); });
}

// ---- What the host's warmup and health checks need from the server (SDK 1.4) ----

pulse_status_t profile_warm_request(void* instance, pulse_call_t* call, const pulse_json_t* sent, pulse_upstream_req_t* out) {
    return guard(g_host, call, [&] {
        const auto& p = *static_cast<Profile*>(instance);
        Json s(g_host->json, sent);
        Json body = s["body"];
        std::string_view path = s["path"].string_or("");
        if (!body.is_object() || path.empty()) return PULSE_OK;  // nothing to replay
        // The same prompt, one output token: the server reads (and caches) the whole prompt.
        Writer w(g_host->json, g_host->request->body(out));
        w.begin_object();
        for (size_t i = 0; i < body.size(); ++i) {
            auto [k, v] = body.member_at(i);
            if (k != "max_tokens" && k != "max_completion_tokens" && k != "return_progress") w.key(k).copy(v);
        }
        w.kv("max_tokens", int64_t{1});
        // llama-server then sends a chunk after every prompt batch, and so notices a closed
        // connection (a replay cancelled for real traffic) at the next batch, not at its
        // once-a-second check.
        if (p.options.server == Options::Server::llama_server) w.key("return_progress").boolean(true);
        w.end_object();
        if (s["root_path"].boolean().value_or(false)) g_host->request->set_root_path(out, str(path));
        else g_host->request->set_path(out, str(path));
        return PULSE_OK;
    });
}

// llama-server keeps its prompt cache in slots (-np) and can write them to files and read them
// back when started with --slot-save-path; it lists them at its root, whatever prefix its
// OpenAI routes have. vLLM has nothing of the kind.
pulse_status_t profile_cache_request(void* instance, pulse_call_t* call, pulse_cache_op_t op, int32_t slot, pulse_str_t name,
                                     pulse_upstream_req_t* out) {
    return guard(g_host, call, [&] {
        const auto& p = *static_cast<Profile*>(instance);
        if (p.options.server != Options::Server::llama_server)
            return g_host->set_error(call, PULSE_E_UNSUPPORTED, str("vLLM has no cache slots to save"));
        if (op == PULSE_CACHE_COUNT) {
            g_host->request->set_root_path(out, str("/props"));
            g_host->request->set_method(out, str("GET"));
            return PULSE_OK;
        }
        if (op != PULSE_CACHE_SAVE && op != PULSE_CACHE_RESTORE) return PULSE_E_UNSUPPORTED;
        Writer w(g_host->json, g_host->request->body(out));
        w.begin_object().kv("filename", view(name)).end_object();
        const std::string path = "/slots/" + std::to_string(slot) + (op == PULSE_CACHE_SAVE ? "?action=save" : "?action=restore");
        g_host->request->set_root_path(out, str(path));
        return PULSE_OK;
    });
}

pulse_status_t profile_cache_answer(void*, pulse_call_t* call, pulse_cache_op_t op, int32_t status, pulse_str_t body, int32_t* out_count) {
    return guard(g_host, call, [&] {
        if (op == PULSE_CACHE_COUNT) {
            Json props(g_host->json, status == 200 ? g_host->json->parse(call, body) : nullptr);
            const int64_t n = props["total_slots"].i64().value_or(0);
            if (n <= 0) return g_host->set_error(call, PULSE_E_UNSUPPORTED, str("GET /props gave no total_slots (HTTP " + std::to_string(status) + ")"));
            *out_count = static_cast<int32_t>(std::min<int64_t>(n, 1024));
            return PULSE_OK;
        }
        if (status == 200) return PULSE_OK;
        // 501 "This server does not support slots action", or a server without the route.
        if (status == 501 || status == 404)
            return g_host->set_error(call, PULSE_E_UNSUPPORTED,
                                     str("start llama-server with --slot-save-path to keep its cache across restarts"));
        std::string_view b = view(body);
        return g_host->set_error(call, PULSE_E_UNAVAILABLE, str("HTTP " + std::to_string(status) + ": " + std::string(b.substr(0, 200))));
    });
}

pulse_status_t profile_probe_answer(void* instance, pulse_call_t* call, int32_t status, pulse_str_t body) {
    return guard(g_host, call, [&] {
        const auto& p = *static_cast<Profile*>(instance);
        if (status == 200) return PULSE_OK;
        // While it loads its model llama-server answers 503 "Loading model": starting, not failed.
        if (p.options.server == Options::Server::llama_server && status == 503 && view(body).find("Loading model") != std::string_view::npos)
            return g_host->set_error(call, PULSE_NOT_READY, str("the backend is still loading its model"));
        return g_host->set_error(call, PULSE_E_UNAVAILABLE, str("not ready"));
    });
}

}  // namespace pulse::chat
