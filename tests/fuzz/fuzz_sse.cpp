// libFuzzer: arbitrary upstream bytes through the SSE parser, every event's data through the
// qwen38 chunk translation, and the deltas through the host's ResponseBuilder. The first
// input byte picks the request shape (tools / forced tool choice / none).
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "gateway/protocol/response_builder.h"
#include "gateway/protocol/sse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace pulse;
    if (size == 0) return 0;
    auto& p = fuzz::Profile::get();
    static const char* kRequests[] = {
        R"({"model":"m","input":"x"})",
        R"({"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"custom","name":"apply_patch"},
            {"type":"namespace","name":"ns","tools":[{"type":"function","name":"g"}]}]})",
        R"({"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":"required"})",
    };
    rapidjson::Document req;
    req.Parse(kRequests[data[0] % 3]);
    pulse_call call;
    void* stream = nullptr;
    if (p.vt().stream_open(p.instance, &call, host::view(&req), &stream) != PULSE_OK) std::abort();
    size_t events = 0;
    gateway::ResponseBuilder b("resp_fuzz0000", "m", static_cast<gateway::ReasoningOutput>(data[0] % 3),
                               [&](std::string_view, std::string_view) { ++events; });
    b.start();
    gateway::SseParser parser;
    bool failed = false;
    parser.feed(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), [&](std::string_view, std::string_view d) {
        if (failed || d == "[DONE]") return;
        pulse_call c;
        if (p.vt().stream_feed(stream, &c, {d.data(), d.size()}, &b) < 0) {
            b.fail(PULSE_E_INTERNAL, c.message);
            failed = true;
        }
    });
    if (!b.ended()) {
        pulse_call c;
        if (p.vt().stream_finish(stream, &c, PULSE_STREAM_CLEAN, &b) < 0) b.fail(PULSE_E_INTERNAL, c.message);
        else b.end(PULSE_STREAM_CLEAN);
    }
    p.vt().stream_close(stream);
    if (!b.ended() || events < 3) std::abort();  // always a terminal event
    return 0;
}
