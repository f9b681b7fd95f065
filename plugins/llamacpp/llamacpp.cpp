// Translation profile "llamacpp": the Responses API <-> llama.cpp's llama-server Chat
// Completions (--jinja tool calling). The translation is shared (plugins/common); what is
// specific to llama-server (docs/PROTOCOL.md, "Backend specifics"):
//   - reasoning arrives as `reasoning_content`, and history replays it the same way;
//   - `cache_prompt: true` by default, and with profile option `slots = N` a stable `id_slot`
//     per Codex conversation (prompt_cache_key), so a conversation keeps its KV slot;
//   - usage may be missing from the final chunk: it is rebuilt from `timings`
//     (prompt_n + cache_n, cache_n, predicted_n); `timings_per_token` makes every chunk carry
//     them, so output and reasoning tokens are counted exactly (it reports no reasoning count,
//     and not every token produces a delta);
//   - a named tool_choice is silently treated as "auto", and "required" is not enforced on
//     some templates: forced choices are enforced with a JSON schema (response_format);
//   - HTTP 500 "Failed to parse tool call arguments as JSON" and exceed_context_size_error are
//     mapped to clear 400s (not retryable as they are);
//   - what warmup and health need (plugins/common/chat_profile.cpp, SDK 1.4): while loading,
//     llama-server answers the probe with 503 "Loading model", read as starting, not failed; a
//     warmup replay asks for `return_progress` so a cancelled one stops at the next prompt
//     batch; its slots are counted (/props) and saved and restored (/slots/N?action=...,
//     with --slot-save-path) across restarts;
//   - a reasoning budget goes out as reasoning_budget_tokens;
//   - with profile option resume = "tokens", a request is a raw /v1/completions of the prompt
//     /apply-template rendered, every token id reported (`verbose`), for a token-exact resume.
#include "chat_profile.h"

namespace {

void adjust(pulse::chat::Options& o, const pulse::Json& cfg) {
    if (!cfg["cache_prompt"].present()) o.cache_prompt = true;  // llama-server's prefix reuse
    o.history_reasoning_field = "reasoning_content";
    o.server = pulse::chat::Options::Server::llama_server;  // resume = "tokens": /apply-template, verbose
    o.token_timings = true;  // exact output and reasoning counts (it reports no reasoning count)
    // llama-server caps reasoning per request with reasoning_budget_tokens (for templates with
    // reasoning tags).
    if (!o.budget_field) o.budget_field = "reasoning_budget_tokens";
}

const pulse::chat::Dialect kDialect = {"llamacpp", adjust};

}  // namespace

PULSE_CHAT_PROFILE_PLUGIN("pulse.translation.llamacpp", "0.1.0", "llamacpp", kDialect)
