// libFuzzer: an arbitrary request body through parse_body_in_place (the parser the gateway
// runs), validate_request and, when it
// passes, the qwen38 profile's build_request and stream_open. Nothing may crash, leak or hang.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.h"
#include "gateway/request/responses_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace pulse;
    auto& p = fuzz::Profile::get();
    rapidjson::Document doc;
    std::string body(reinterpret_cast<const char*>(data), size);  // parsed in place: the string is the document's storage
    if (gateway::parse_body_in_place(body, doc)) return 0;
    if (gateway::validate_request(doc)) return 0;
    pulse_call call;
    pulse_upstream_req out;
    if (p.vt().build_request(p.instance, &call, host::view(&doc), host::view(&p.model), &out) == PULSE_OK && !out.body.complete())
        std::abort();  // a successful build must produce one complete JSON object
    void* stream = nullptr;
    if (p.vt().stream_open(p.instance, &call, host::view(&doc), &stream) == PULSE_OK) p.vt().stream_close(stream);
    return 0;
}
