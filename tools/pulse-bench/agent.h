// `pulse bench agent`: a matched agent-evaluation suite (docs/BENCHMARKS.md, "agent").
//
// Two kinds of task. A tool-calling scenario gives the model tools and a request, plays the
// tool results back from its script, and scores the calls made (the right tool, arguments that
// pass their checks, in order, no extra calls) and the final answer. A repository task gives
// the model a small repository and four tools (list_files, read_file, write_file, run) whose
// commands run for real in the sandbox, and a check script decides the outcome.
//
// Every arm gets the same tasks, sampler and seeds, in the same order, with the same tool
// implementations: the arms differ only in what is compared.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <rapidjson/document.h>

#include "pulse-bench/client.h"
#include "pulse-bench/sandbox.h"

namespace pulse::bench::agent {

// A check on one value: {"equals": V} | {"contains": S} | {"regex": R} | {"one_of": [V...]} |
// {"present": true} | {"between": [LO, HI]} | {"not_contains": S}.
struct Check {
    std::string op;
    std::string text;  // the operand as JSON text
};

struct ExpectedCall {
    std::string tool;
    std::vector<std::pair<std::string, Check>> args;  // argument name -> check
    std::string result;                               // what the tool "returns" (text)
};

struct Task {
    std::string id, kind;  // kind: "tools" or "repo"
    std::string category;  // what it measures (simple, multiple, parallel, ...); default: the kind
    bool smoke = false;    // in the fast subset (--kind smoke)
    std::string system, user;
    std::string tools_json = "[]";  // function tools: [{"name","description","parameters"}]
    std::vector<ExpectedCall> expect;
    std::vector<Check> final_checks;  // on the final answer's text
    Files files;                      // repo: the repository
    std::string check;                // repo: sh command; exit 0 pass, 3 partial, else fail
    int max_turns = 6;
};

// {"tasks": [...]} (docs/BENCHMARKS.md has the format). Throws std::runtime_error naming the
// task and the field that is wrong.
std::vector<Task> load_suite(const std::string& json, const std::string& source);

struct Call {
    std::string id, name, args;  // args as the model wrote them (JSON text, maybe broken)
};

// One answer of the model: its text, its tool calls, what it cost.
struct Reply {
    bool ok = false;
    std::string error;  // the request failed (not the model)
    std::string text;
    std::vector<Call> calls;
    int64_t input_tokens = 0, output_tokens = 0;
    bool cut = false;  // ended at the request's output cap (finish_reason length, status incomplete)
    int64_t budget = -1;  // the reasoning budget a Pulse gateway applied (X-Pulse-Reasoning-Budget), -1 = none
};

// The conversation so far, as the tasks' loop keeps it.
struct Conversation {
    std::string system, user, tools_json;
    struct Step {
        Reply reply;
        std::vector<std::pair<Call, std::string>> results;  // each call and what its tool returned
    };
    std::vector<Step> steps;
};

struct Sampler {
    double temperature = 0;
    int64_t seed = 0;  // per task: the same on every arm
    int max_tokens = 512;
    std::string effort;  // responses: reasoning.effort ("" = none)
};

// One request through Chat Completions or a Pulse gateway's Responses API (not streamed).
Reply ask_chat(const Endpoint& ep, const Conversation& c, const Sampler& s, double timeout_s);
Reply ask_responses(const Endpoint& ep, const Conversation& c, const Sampler& s, double timeout_s);

struct Result {
    std::string outcome;  // pass, partial, fail; error when a request failed
    std::string detail;   // why, in a line
    int turns = 0, calls = 0, matched = 0, extra_calls = 0, unknown_tools = 0, bad_arguments = 0;
    int64_t input_tokens = 0, output_tokens = 0;
    int cut = 0;  // answers the backend cut at the output cap (max tokens), not the model
    int64_t budget = -1;  // the largest reasoning budget a gateway applied to its requests
    double seconds = 0;
    std::vector<std::string> transcript;  // one line per model turn and tool result
    std::vector<std::string> wrong;       // the calls that counted as errors, as "name(args)"
};

using Ask = std::function<Reply(const Conversation&)>;

// Runs one task to its end against `ask` and scores it.
Result run_task(const Task& t, const Ask& ask, const SandboxLimits& limits);

// Paired comparison of two arms over the same tasks (true = passed).
struct Paired {
    int n = 0, both = 0, only_a = 0, only_b = 0, neither = 0;
    double diff = 0, lo = 0, hi = 0;  // pass rate of b minus a, with a 95 % interval
    double mcnemar_p = 1;             // exact two-sided McNemar test on the discordant pairs
};
Paired compare(const std::vector<bool>& a, const std::vector<bool>& b);

}  // namespace pulse::bench::agent
