// What a /v1/responses request asks for, settled before any endpoint is tried — the first
// part of the request path: the body parsed and validated, the model found, the routing key,
// the model's policy decision written into the request; and, once the profile has built the
// upstream request, how its reasoning budget is applied (a structured value, not prose).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <rapidjson/document.h>

#include "gateway/request/responses_api.h"

namespace pulse::gateway {

struct ModelRuntime;
struct Snapshot;

struct RequestPlan {
    rapidjson::Document doc;   // parsed in place: its strings point into the request's body
    std::string model_id;
    std::string conversation;  // conversation_key(doc)
    const ModelRuntime* rt = nullptr;
    bool streaming = false;
    size_t body_bytes = 0;     // the body as the client sent it

    // The request's max_output_tokens, or the model's configured default for it.
    std::optional<int64_t> output_limit() const;
    // reasoning.budget_tokens, if the request (or its policy) set one.
    std::optional<int64_t> reasoning_budget() const;
};

// Parses `body` in place, writes it to the trace file (if one is configured), validates it and
// finds its model. The 4xx error when the request cannot be served as sent.
std::optional<RequestError> plan_request(std::string& body, const Snapshot& snap, const std::string& response_id, RequestPlan& out);

// Asks the model's policy (if it has one) and writes its decision (reasoning budget, effort,
// sampling) into the document. Never fails the request: a late, failed or unusable decision
// leaves it as the client sent it (logged, counted).
void apply_policy(RequestPlan& plan, const std::string& response_id);

// How the request's reasoning budget is applied, from the profile's notes on the upstream
// request (SDK: request->annotate "reasoning_budget" and, 1.2, "reasoning_budget_field") and
// whether the model's in-process backends read that field.
struct BudgetReport {
    int64_t budget = 0;
    bool enforced = false;
    std::string field;  // the upstream field that carries it (enforced), else ""
    std::string how;    // "enforced by FIELD", or "not enforced: WHY"
    std::string header() const { return std::to_string(budget) + "; " + how; }  // X-Pulse-Reasoning-Budget
};
std::optional<BudgetReport> budget_report(const RequestPlan& plan, const std::map<std::string, std::string>& notes);

// A conversation's key, the same for every turn of it: Codex's prompt_cache_key ("k:..."), else
// a hash of what a conversation starts with and never changes: its instructions and its first
// user message ("h:..."). Keys sticky routing and warmup's store.
std::string conversation_key(const rapidjson::Value& request);

// Appends one JSON line ({"id","what","body"}) to the trace file `file` (server.trace_file):
// a regular file of one name, made 0600; anything else is refused and logged once a minute.
void trace(const std::string& file, const std::string& id, const char* what, std::string_view json);

}  // namespace pulse::gateway
