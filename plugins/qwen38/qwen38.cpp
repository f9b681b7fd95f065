// Translation profile "qwen38": the Responses API <-> vLLM Chat Completions, for vLLM serving
// Qwen3.8-Flash-Next (qwen3_coder tool parser, qwen3 reasoning parser, MTP). The translation
// is shared (plugins/common); what is specific to vLLM (docs/PROTOCOL.md, "Backend specifics"):
//   - reasoning arrives as `reasoning` (vLLM >= 0.12) or `reasoning_content` (older): both read;
//     history replays it as `reasoning_content`, which Qwen templates read;
//   - tool_choice "required"/named is accepted but not always applied: a forced choice is
//     constrained with a JSON schema (profile option force_tool_choice = "schema", default);
//   - context overflow is a 400 whose message says "maximum context length";
//   - warmup replays the served request with max_tokens 1; vLLM has no cache to save, and its
//     probe is ready on HTTP 200 only;
//   - a reasoning budget goes out as thinking_token_budget (enforced by a vLLM with a reasoning
//     parser or --reasoning-config; one that refuses the field gets the request without it);
//   - with profile option resume = "tokens", a request is a raw /v1/completions of the prompt
//     ids /tokenize rendered, every token id reported (return_token_ids), for a token-exact resume.
#include "chat_profile.h"

namespace {

void adjust(pulse::chat::Options& o, const pulse::Json&) {
    if (o.cache_prompt || o.slots)
        throw pulse::Error(PULSE_E_INVALID_ARGUMENT, "qwen38: cache_prompt and slots are llama-server options (profile llamacpp)");
    o.server = pulse::chat::Options::Server::vllm;  // resume = "tokens": /tokenize, return_token_ids
    o.history_reasoning_field = "reasoning_content";
    // vLLM caps reasoning per request with thinking_token_budget once it knows the model's
    // reasoning markers: --reasoning-config, or (newer vLLM) derived from --reasoning-parser. A
    // vLLM that cannot refuses the field with a 400; the host then sends the request without it.
    if (!o.budget_field) o.budget_field = "thinking_token_budget";
    o.budget_requires = "vLLM with a reasoning parser or --reasoning-config";
}

const pulse::chat::Dialect kDialect = {"qwen38", adjust};

}  // namespace

PULSE_CHAT_PROFILE_PLUGIN("pulse.translation.qwen38", "0.1.0", "qwen38", kDialect)
