// Responses API <-> OpenAI Chat Completions translation, shared by the translation profiles
// that talk to Chat Completions backends (qwen38 for vLLM, llamacpp for llama-server).
// Profiles differ only in their Options and in small dialect hooks; the logic lives here once.
//
// Compiled into each profile plugin (a static library with hidden symbols): nothing here
// crosses the ABI; it reads requests through the host's JSON views and writes through the
// host's writer and delta sink.
#pragma once

#include <pulse/plugin.hpp>

#include "qwen_format.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace pulse::chat {

// How the model's thinking is switched per request.
enum class Thinking { effort, on, off };
// How tool_choice "required" / named is enforced.
enum class ForceMode { schema, native };

// A profile's chat_template_kwargs entry: a template switch and its scalar value.
struct TemplateKwarg {
    std::string key;
    std::variant<std::string, bool, int64_t, double> value;
};

struct Options {
    Thinking thinking = Thinking::effort;
    ForceMode force = ForceMode::schema;
    std::string ns_separator = "__";
    bool pass_images = true;
    // Extra chat_template_kwargs from the profile options, written after the per-request
    // enable_thinking (which they may not name).
    std::vector<TemplateKwarg> template_kwargs;
    // Dialect: which field carries reasoning in history replays.
    std::string history_reasoning_field = "reasoning_content";
    // llama-server extras: "cache_prompt": true and a stable id_slot per prompt_cache_key.
    bool cache_prompt = false;
    int64_t slots = 0;  // 0 = don't pin slots
    // llama-server: "timings_per_token": true, so every chunk says how many tokens are generated
    // so far (timings.predicted_n). It reports no reasoning count and some tokens produce no
    // delta (the end of the thinking block, text its parser holds back): deltas are no count.
    bool token_timings = false;
    // The request field that caps reasoning tokens per request (a request's
    // reasoning.budget_tokens goes there); "" = the backend has none. Unset: the dialect's.
    std::optional<std::string> budget_field;
    std::string budget_requires;  // what the backend needs for the field to work, for the report
    // profile_options.resume = "tokens" (llama-server): a request the model's own parser can read
    // (Qwen3.5's output format) goes out as a raw completion of the server's rendered prompt, so
    // that a resume continues from the very tokens generated, not from re-tokenized text.
    bool token_resume = false;
    // How the server renders a prompt and reports token ids (set by the dialect): llama-server
    // (/apply-template gives the prompt text; `verbose` gives each chunk's id) or vLLM (/tokenize
    // gives the prompt's ids; `return_token_ids` each chunk's ids).
    enum class Server { llama_server, vllm } server = Server::llama_server;

    // Parses [models.X.profile_options]; throws pulse::Error(INVALID_ARGUMENT) naming the key.
    // `allowed_extra` lists dialect-specific keys the caller handles itself.
    static Options parse(const Json& cfg, std::string_view profile);
};

// What the backend saw a tool as, to map calls back.
struct ToolInfo {
    std::string name;       // as Codex knows it
    std::string ns;         // namespace ("" for none)
    bool custom = false;    // a `custom` (freeform) tool: call carries raw `input`
    std::string params;     // its parameters' JSON schema, for typing a raw completion's call values
};
using ToolMap = std::map<std::string, ToolInfo>;  // keyed by the backend-side (flattened) name

// The forced tool choice of a request.
struct Forced {
    bool active = false;           // "required" or named
    std::string only;              // backend-side name for a named choice
};

// Everything the response side needs to know about the request.
struct RequestInfo {
    ToolMap tools;
    Forced forced;
    std::vector<std::string> dropped_tools;  // e.g. "web_search"
    bool thinking = false;                   // the model thinks for this request
};

// Reads tools and tool_choice (used by build_request and by stream_open).
RequestInfo request_info(const Options& opt, const Json& req);

// Whether the model thinks for this request (the profile's thinking option, else the effort).
bool thinking_on(const Options& opt, const Json& req);

// How a request's reasoning budget (reasoning.budget_tokens) is applied, as the profile reports
// it to the host (request->annotate "reasoning_budget"); nullopt when it has none.
std::optional<std::string> budget_note(const Options& opt, const Json& req);

// What the client already has of an answer that is being resumed on another endpoint.
struct Partial {
    std::string text, reasoning;
    // Tokens the earlier attempts already spent (the partial's output_tokens and
    // .reasoning_tokens): the continuation may spend only what is left of the request's limits.
    int64_t output_tokens = 0, reasoning_tokens = 0;
    // The backends' token record (partial.trail, SDK 1.3): the ids generated so far and their
    // raw text. Empty when the host had none: the resume then goes by text.
    std::vector<int32_t> tokens;
    std::string raw;
};

// Whether a request can be served as a raw completion (Options::token_resume): one whose
// output Pulse parses itself (no tool choice forced through a schema, no JSON-schema answer,
// no image, no reasoning budget: those need the server's chat handling).
bool raw_eligible(const Options& opt, const Json& req, const RequestInfo& info);

// Writes the raw completion body (OpenAI /v1/completions): the server's rendered prompt (from
// `prepared`), followed by `resume`'s token ids when it continues one, with the request's
// sampling and limits, and the switch that makes the server report each token's id.
void write_raw_request(const Options& opt, const Json& req, const Json& model, const Json& prepared, const Partial* resume,
                       Writer& w);

// The server's rendered prompt in `prepared` (prepare's answer): llama-server's {"prompt": text},
// vLLM's {"tokens": [ids]}. False when it has neither.
bool has_rendered_prompt(const Options& opt, const Json& prepared);

// The preparatory request that renders a request's prompt on the server (prepare).
void write_render_request(const pulse_host_api_t* host, pulse_call_t* call, const Options& opt, const Json& req, const Json& model,
                          const RequestInfo& info, Writer& w, const Log& log);
std::string_view render_path(const Options& opt);

// Writes the Chat Completions body for a Responses request. `model` is the host's model view
// ({id, upstream_model, sampling{...}, context_window}). Throws pulse::Error.
// Invalid history arguments are replaced (and logged through `log`), never sent through broken.
// With `resume`, the body asks the backend to continue that partial answer: it is the last
// message, an assistant message the server continues instead of closing (vLLM and llama-server
// both read `continue_final_message: true` with `add_generation_prompt: false`).
// With `render_only`, only what the chat template reads (model, messages, tools,
// chat_template_kwargs, add_generation_prompt): the body of vLLM's /tokenize.
void write_request(const pulse_host_api_t* host, pulse_call_t* call, const Options& opt, const Json& req,
                   const Json& model, const RequestInfo& info, Writer& w, const Log& log,
                   const Partial* resume = nullptr, bool render_only = false);

// Streaming side: one upstream payload at a time -> deltas.
class ChunkTranslator {
public:
    ChunkTranslator(const pulse_host_api_t* host, RequestInfo info) : host_(host), info_(std::move(info)) {}

    // One SSE `data` payload (a chunk, or {"error":...}).
    pulse_status_t feed(pulse_call_t* call, std::string_view data, pulse_delta_sink_t* sink);
    // The upstream ended.
    pulse_status_t finish(pulse_call_t* call, pulse_stream_end_t how, pulse_delta_sink_t* sink);
    // This stream reads a continuation of `p`. A server that does not know
    // continue_final_message (llama-server before it had it) still continues a trailing
    // assistant message, but repeats it at the start of the stream: a repeat of the whole
    // partial text (or reasoning) in the first deltas is dropped, anything else passes.
    void expect_echo(const Partial& p);
    // This stream reads a raw completion that continues `p`'s token record: the record's raw
    // text is parsed again (nothing of it re-emitted but a tool call not yet sent), so the
    // parser stands where the failed stream's stood.
    void continue_raw(const Partial& p);

private:
    pulse_status_t feed_raw(pulse_call_t* call, const Json& chunk, pulse_delta_sink_t* sink);
    pulse_status_t feed_choice(const Json& choice, pulse_delta_sink_t* sink);
    pulse_status_t feed_usage(const Json& chunk, pulse_delta_sink_t* sink);
    int64_t thought_tokens(int64_t output) const;
    pulse_status_t finish_raw(pulse_call_t* call, pulse_delta_sink_t* sink);
    pulse_status_t raw_events(pulse_call_t* call, const std::vector<qwen::OutputParser::Event>& events, pulse_delta_sink_t* sink);

    // An expected repeat of what the client already has, on one channel.
    struct Echo {
        std::string left;  // not yet matched
        std::string held;  // matched so far, not yet emitted
        bool done = true;
        // Returns the text to emit now from delta `d`.
        std::string take(std::string_view d);
    };
    struct PendingCall {
        std::string id, name, args;
    };
    pulse_status_t flush_calls(pulse_call_t* call, pulse_delta_sink_t* sink);
    pulse_status_t emit_call(pulse_call_t* call, pulse_delta_sink_t* sink, uint32_t index, const std::string& backend_name,
                             const std::string& args);

    const pulse_host_api_t* host_;
    RequestInfo info_;
    std::map<uint32_t, PendingCall> calls_;  // by Chat Completions tool_call index
    std::string forced_content_;            // schema-forced output is JSON in content
    std::optional<pulse_finish_t> finish_;
    uint32_t emitted_calls_ = 0;
    Echo echo_text_, echo_reasoning_;
    // Per-token counts (Options::token_timings): the tokens generated so far, and once the
    // answer left its thinking block, how many of them the thinking took.
    int64_t generated_ = -1;
    bool per_token_ = false;
    std::optional<int64_t> thought_;
    // A raw completion (text_completion chunks): Pulse's own parser reads the model's text.
    std::optional<qwen::OutputParser> raw_;
    int64_t raw_tokens_ = 0, raw_thought_ = 0;  // this stream's ids, and how many were thinking
    uint32_t raw_calls_ = 0;
    bool trail_lost_ = false;
};

// The request's sampling fields, token limit (what is left of it for a continuation) and
// llama-server's cache_prompt / id_slot: the same in a chat and a raw completion request.
void write_sampling(const Options& opt, const Json& req, const Json& model, const Partial* resume, Writer& w);

// A chunk's finish_reason as the SDK says it; the start of a long text, for messages.
pulse_finish_t finish_from(std::string_view reason);
std::string excerpt(std::string_view s, size_t n = 200);

// Classifies an upstream HTTP error body (vLLM and llama-server shapes).
pulse_status_t map_http_error(const pulse_host_api_t* host, pulse_call_t* call, int32_t status, std::string_view body);

// Adds the `*** Begin Patch` / `*** End Patch` lines a model sometimes forgets.
std::string repair_patch(std::string_view input);

}  // namespace pulse::chat
