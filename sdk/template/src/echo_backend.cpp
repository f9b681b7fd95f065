// Example backend plugin for the Pulse SDK: "example-echo".
//
// It speaks the upstream dialect a backend must speak (a Chat Completions request in, Chat
// Completions chunks out) and answers every request by echoing the last user message back, a
// word per chunk, followed by the finish chunk and a usage chunk, exactly like vLLM streams.
// It is the smallest complete backend: use it as the template for a real engine.
//
// Build it out of tree with nothing but the installed SDK: this project's meson.build
// (`meson setup build && meson test -C build`), or a plain compiler line:
//   c++ -std=c++17 -shared -fPIC $(pkg-config --cflags pulse-sdk) $(pkg-config --variable=plugin_cflags pulse-sdk) echo_backend.cpp
//       $(pkg-config --libs pulse-sdk) -o example_echo.so       (one line)
#include <pulse/plugin.hpp>

#include <atomic>
#include <cstdio>
#include <memory>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

const pulse_host_api_t* g_host = nullptr;

struct Backend {
    int64_t delay_ms = 0;       // pause before each chunk (simulates decode time)
    std::string prefix = "echo: ";
};

struct Stream {
    std::vector<std::string> chunks;  // ready-made JSON payloads
    size_t next = 0;
    int64_t delay_ms = 0;
    std::chrono::steady_clock::time_point due;  // when chunks[next] may go out
    std::atomic<bool> cancelled{false};
};

// Text of a Chat Completions message `content`: a string, or an array of {type:"text",text}.
std::string content_text(const pulse::Json& content) {
    if (auto s = content.string()) return std::string(*s);
    std::string out;
    for (size_t i = 0; i < content.size(); ++i)
        if (auto t = content.at(i)["text"].string()) out += *t;
    return out;
}

pulse_status_t create(void*, pulse_call_t* call, const pulse_json_t* config, void** out) {
    return pulse::guard(g_host, call, [&] {
        pulse::Json cfg(g_host->json, config);
        auto b = std::make_unique<Backend>();
        for (size_t i = 0; i < cfg.size(); ++i) {
            auto [key, value] = cfg.member_at(i);
            if (key == "delay_ms" && value.i64()) b->delay_ms = *value.i64();
            else if (key == "prefix" && value.string()) b->prefix = std::string(*value.string());
            else throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "example-echo: unknown or mistyped option '" +
                                                                  std::string(key) + "' (allowed: delay_ms, prefix)");
        }
        *out = b.release();
        return PULSE_OK;
    });
}

void destroy(void* b) { delete static_cast<Backend*>(b); }

pulse_status_t stream_start(void* backend, pulse_call_t* call, const pulse_json_t* request, void** out) {
    return pulse::guard(g_host, call, [&] {
        const auto& b = *static_cast<Backend*>(backend);
        pulse::Json req(g_host->json, request);
        pulse::Json messages = req["messages"];
        if (!messages.is_array() || messages.size() == 0)
            throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "example-echo: request has no messages");
        std::string last_user;
        int64_t prompt_words = 0;
        for (size_t i = 0; i < messages.size(); ++i) {
            std::string text = content_text(messages.at(i)["content"]);
            bool in_word = false;
            for (char c : text) {
                bool space = c == ' ' || c == '\n' || c == '\t';
                if (!space && !in_word) ++prompt_words;
                in_word = !space;
            }
            if (messages.at(i)["role"].string_or("") == "user") last_user = text;
        }
        std::string model = std::string(req["model"].string_or("example-echo"));
        std::string head = "{\"id\":\"chatcmpl-echo\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":" +
                           pulse::json_quote(model) + ",\"choices\":";
        auto s = std::make_unique<Stream>();
        s->delay_ms = b.delay_ms;
        s->due = std::chrono::steady_clock::now() + std::chrono::milliseconds(b.delay_ms);
        s->chunks.push_back(head + "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}");
        std::string answer = b.prefix + last_user;
        int64_t pieces = 0;
        for (size_t pos = 0; pos < answer.size();) {
            size_t end = answer.find(' ', pos);
            end = end == std::string::npos ? answer.size() : end + 1;
            s->chunks.push_back(head + "[{\"index\":0,\"delta\":{\"content\":" +
                                pulse::json_quote(answer.substr(pos, end - pos)) + "},\"finish_reason\":null}]}");
            ++pieces;
            pos = end;
        }
        s->chunks.push_back(head + "[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}");
        s->chunks.push_back(head + "[],\"usage\":{\"prompt_tokens\":" + std::to_string(prompt_words) +
                            ",\"completion_tokens\":" + std::to_string(pieces) + ",\"total_tokens\":" +
                            std::to_string(prompt_words + pieces) + "}}");
        *out = s.release();
        return PULSE_OK;
    });
}

pulse_status_t stream_next(void* stream, pulse_call_t* call, uint32_t timeout_ms, pulse_chunk_sink_t* sink) {
    auto& s = *static_cast<Stream*>(stream);
    if (s.cancelled.load()) return g_host->set_error(call, PULSE_E_CANCELLED, pulse::str("cancelled"));
    if (s.next >= s.chunks.size()) return PULSE_END;
    // Wait for the next chunk's due time, at most `timeout_ms`, in small steps so a cancel is
    // noticed promptly. The due time survives TIMEOUT returns: the host polls again.
    auto until = std::min(s.due, std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms));
    while (std::chrono::steady_clock::now() < until && !s.cancelled.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (s.cancelled.load()) return g_host->set_error(call, PULSE_E_CANCELLED, pulse::str("cancelled"));
    if (std::chrono::steady_clock::now() < s.due) return PULSE_TIMEOUT;
    s.due = std::chrono::steady_clock::now() + std::chrono::milliseconds(s.delay_ms);
    return g_host->chunk->data(sink, pulse::str(s.chunks[s.next++]));
}

void stream_cancel(void* stream) { static_cast<Stream*>(stream)->cancelled.store(true); }
void stream_close(void* stream) { delete static_cast<Stream*>(stream); }

pulse_status_t health(void*, pulse_call_t*, pulse_json_writer_t* out) {
    pulse::Writer w(g_host->json, out);
    w.begin_object().kv("status", "ok").end_object();
    return w.ok() ? PULSE_OK : PULSE_E_INTERNAL;
}

const pulse_backend_vt_t kBackend = {
    sizeof(pulse_backend_vt_t), "example-echo", create, destroy, stream_start, stream_next,
    stream_cancel, stream_close, health,
    nullptr,  // budget_fields: it does not think, so no reasoning budget field is enforced
};

pulse_status_t init(const pulse_host_api_t* host, pulse_host_ctx_t* ctx, pulse_call_t* call, void** state) {
    g_host = host;
    *state = nullptr;
    return pulse::guard(host, call, [&] { return host->register_backend(ctx, &kBackend, sizeof kBackend, nullptr); });
}

void deinit(void*) {}

const pulse_plugin_info_t kInfo = {
    PULSE_PLUGIN_INFO_HEAD(PULSE_KIND_BACKEND, "pulse.example.echo", "1.0.0"),
    PULSE_BUILD_INFO, nullptr, init, deinit,
};

}  // namespace

extern "C" PULSE_EXPORT const pulse_plugin_info_t* pulse_plugin_entry_v1(void) { return &kInfo; }
