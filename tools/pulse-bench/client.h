// The measuring client of `pulse bench`: one streamed request with its timings, against any
// OpenAI-compatible server (Chat Completions) or a Pulse gateway (Responses), plus what the
// server says about itself for the result's conditions.
#pragma once

#include <cstdint>
#include <string>

#include <rapidjson/document.h>

namespace pulse::bench {

struct Endpoint {
    std::string name;   // arm name in reports ("a", "baseline", ...)
    std::string base;   // http://host:port/v1
    std::string model;  // request "model"; "" = the first id /v1/models lists
    std::string api_key;
    std::string root() const;  // base without a trailing /v1
};

// "URL", "NAME=URL" or either with "#MODEL" (that arm's request model: two models of one
// gateway, say with different policies). Throws std::invalid_argument for anything else.
Endpoint parse_endpoint(const std::string& spec, const std::string& default_name);

struct HttpReply {
    int status = 0;       // 0 = no HTTP answer (see error)
    std::string body;
    std::string error;
    std::string reasoning_budget;  // a Pulse gateway's X-Pulse-Reasoning-Budget ("N; enforced by ...")
};
HttpReply http_get(const std::string& url, double timeout_s, const std::string& api_key = "");
HttpReply http_post(const std::string& url, const std::string& body, double timeout_s, const std::string& api_key = "");

// One streamed request. Times are seconds from the moment the request was sent.
struct StreamResult {
    bool ok = false;
    std::string error;
    int status = 0;
    double ttft = -1;      // first output text (content or reasoning); keepalives do not count
    double last_token = -1;  // last output text
    double end = -1;       // terminal event / [DONE]
    std::string text, reasoning, finish_reason;
    int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = -1;
    int64_t reasoning_tokens = -1;  // of completion_tokens, when the server says
    int output_chunks = 0;  // chunks that carried output text (under MTP, several tokens each)
    int64_t draft_n = -1, draft_accepted = -1;  // llama-server timings, when present

    // Output tokens after the first per second after the first (docs/BENCHMARKS.md, "decode tok/s").
    double decode_tps() const;
};

// POST base/chat/completions with `body` (stream forced on, usage requested).
StreamResult stream_chat(const Endpoint& ep, rapidjson::Document body, double timeout_s);
// POST base/responses (a Pulse gateway) with `body` (stream forced on).
StreamResult stream_responses(const Endpoint& ep, rapidjson::Document body, double timeout_s);

// What the server says about itself: served model, context, version, llama-server props.
struct BackendInfo {
    std::string model, owned_by, root, version;
    int64_t max_model_len = -1;
    std::string props;  // llama-server /props, selected fields as JSON ("" when absent)
};
BackendInfo probe_backend(const Endpoint& ep, double timeout_s = 10);

}  // namespace pulse::bench
