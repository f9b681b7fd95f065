// A fake vLLM OpenAI-compatible server for tests. It reproduces vLLM's streaming shape (role
// chunk with empty content, `reasoning` deltas, tool calls whose first delta carries id/type/
// name and whose arguments arrive in fragments, a finish chunk, a usage chunk with
// `choices: []`, then `data: [DONE]`), and follows a script.
//
//   fake_vllm --script FILE [--port N] [--record FILE] [--flavor vllm|llamacpp]
//             [--served-name NAME] [--max-model-len N]   (what /v1/models reports)
//
// The script is JSON: {"turns": [TURN, ...], "split": 8, "delay_ms": 0}. The turn for a request
// is chosen by how many `tool` messages the request carries (so a client retry gets the same
// turn), clamped to the last. A TURN may hold:
//   "reasoning": text           streamed as `reasoning` deltas (`reasoning_content` if
//                               "reasoning_field" says so)
//   "content": text             streamed as content deltas, a word at a time
//   "tool_calls": [{"name", "arguments": object or raw string}]
//   "finish_reason": string     default "tool_calls" when there are calls, else "stop"
//   "status": N, "body": text   answer HTTP N with that body instead of streaming
//                               ("retry_after": S adds a Retry-After header)
//   "head_stall_ms": N          take the request, then send nothing at all for N ms (a hung
//                               engine behind a live socket), then answer as scripted
//   "drop_after_head": true     send the 200 head, then close the connection: no event at all
//   "stream_error": text        after the role chunk, send {"error":{...}} then [DONE]
//   "truncate": true            close the stream without [DONE]
//   "delay_ms": N               pause before each chunk (and "first_delay_ms" before the first)
//   "usage": {"prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens"}
//   "progress": {"total", "steps", "every_ms", "stall_after_steps", "stall_ms"}
//                               llamacpp flavor, requests with return_progress: prefill progress
//                               chunks first, as llama-server sends them (see below)
// A request's "max_tokens" is honoured as the real servers do: after that many output deltas
// (one delta is one token here) the stream finishes with finish_reason "length".
//   "match": text              the turn for any request whose body contains text (checked
//                               first, in order; requests matching none use the rule above);
//                               with "tools_seen": N only when the request carries N tool messages
// A request with "stream": false gets the turn as one chat.completion object (content, reasoning,
// tool calls, usage; the streaming faults do not apply; its "max_tokens" cuts the output as in a
// stream, finish_reason "length"; vllm flavor: a named "tool_choice" function makes the answer
// that call, as vLLM's structured output does).
//   "die_after": N, "die": how  fail mid-stream after N output deltas (reasoning, content and
//                               tool-call deltas; the role chunk is not one): "drop" (default)
//                               closes the connection, "kill" SIGKILLs this process (kill -9),
//                               "error" sends an {"error":{...}} event then [DONE], "malformed"
//                               a chunk that is not JSON (cut mid-object) then [DONE], "stall"
//                               sends nothing more for "stall_ms" (default 60000) then ends.
//                               A continuation request (below) does not fail unless
//                               "die_on_continuation" is true.
// Continuation (assistant prefill) as the real servers do it, so mid-stream resume is tested
// against their rules. A request whose last message is an assistant message continues it:
//   vllm flavor: only with "continue_final_message": true and "add_generation_prompt": false
//     (both true is a 400, as in vLLM; a trailing assistant message without the flag is a
//     closed turn and the answer starts over). The chat template closes the reasoning of the
//     continued message, so the answer goes on with content: the scripted content minus the
//     prefilled content when it starts with it, no more reasoning.
//   llamacpp flavor: continue_final_message true / "content" / "reasoning_content" (with
//     add_generation_prompt false, else a 400), or implicitly without the field (llama-server's
//     prefill). Automatic mode continues the reasoning when the message has reasoning and no
//     content, else the content. An implicit prefill repeats the prefilled reasoning and
//     content in the first deltas (llama-server's echo); an explicit one does not. A continued
//     message with tool_calls is a 400. Top-level "legacy_prefill": true ignores the field, as
//     llama-server builds from before it had it do (every continuation is an implicit one).
// Reasoning budget: with top-level "reasoning_config": true (vLLM started with
// --reasoning-config, or since it derives one, with --reasoning-parser) a request's
// thinking_token_budget cuts the reasoning after that many deltas and the answer follows;
// without it vLLM refuses the request (400 "thinking_token_budget is set but reasoning_config is
// not configured...") and so does this fake. The
// llamacpp flavor always honours reasoning_budget_tokens (llama-server does, for templates with
// reasoning tags).
// "spec": {"drafts_per_request": D, "accept": [p1, p2, ...]} simulates MTP counters: each
// streamed response adds D drafts of K = len(accept) tokens and round(D * p_i) accepted at
// position i to /metrics (vLLM names; the llamacpp flavor also reports timings.draft_n*).
// Top-level options: "slots": N (llamacpp flavor) is what GET /props reports as total_slots
// (default 4). "slot_save": true (llamacpp flavor) answers slot saves and restores as
// llama-server started with --slot-save-path does, and records every GET /props and slot
// action as a line {"cache_request": "GET /props"} in the --record file. "vision": true (llamacpp flavor) accepts images; without it an image is
// answered 500 "image input is not supported", as by llama-server without --mmproj. "step_ms": N paces every stream by one process-wide clock instead: each
// chunk leaves at the next multiple of N ms, so concurrent streams send their tokens together,
// as a batched engine (vLLM, llama-server) does at each decode step. "fail_first": N answers the first N requests with HTTP "fail_status"
// (default 503); "prefix_cache": true simulates vLLM's prefix cache: cached_tokens is the
// longest prefix (in 4-character "tokens") this process has seen before, so a restarted
// backend starts cold; with it, "prefill_us_per_token": N delays the first chunk by N µs per
// uncached prompt token, as a real engine's prefill does, one prefill at a time (an engine's
// compute is shared: concurrent prefills queue). "loading_ms": N makes every request (and /v1/models) answer 503
// "Loading model" for the first N ms, like llama-server while it loads.
// Each request body is appended to --record as one JSON line, followed by a line
// {"served": N, "chunks": K, "client_gone": bool, "peer_port": P} once the response ends (P: the
// client's port, which tells which connection carried the request).
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerRequestImpl.h>
#include <Poco/Net/StreamSocket.h>
#include <sys/socket.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <rapidjson/document.h>

#include <cmath>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "args/args.h"

namespace {

rapidjson::Document g_script;
std::string g_record;
std::string g_flavor = "vllm";
std::string g_served_name = "fake";
// --served-name given: requests for another model get vLLM's 404, and /v1/models says
// "owned_by": "vllm" as vLLM does. Without it any name is served, and /v1/models does not claim
// to be a vLLM that serves only the name it lists.
bool g_check_model = false;
std::string g_max_model_len = "262144";
std::mutex g_record_mutex;
std::atomic<int> g_served{0};
const auto g_started = std::chrono::steady_clock::now();

bool still_loading() {
    auto it = g_script.FindMember("loading_ms");
    if (it == g_script.MemberEnd() || !it->value.IsInt64()) return false;
    return std::chrono::steady_clock::now() - g_started < std::chrono::milliseconds(it->value.GetInt64());
}
std::mutex g_spec_mutex;
double g_spec_drafts = 0, g_spec_draft_tokens = 0;
std::vector<double> g_spec_per_pos;

// Adds one response's simulated drafts; returns {draft tokens, accepted} for the timings.
std::pair<int64_t, int64_t> spec_account() {
    auto it = g_script.FindMember("spec");
    if (it == g_script.MemberEnd() || !it->value.IsObject()) return {-1, -1};
    const auto& spec = it->value;
    double d = spec.HasMember("drafts_per_request") ? spec["drafts_per_request"].GetDouble() : 0;
    std::lock_guard lock(g_spec_mutex);
    const auto& acc = spec["accept"].GetArray();
    g_spec_per_pos.resize(acc.Size(), 0);
    int64_t accepted = 0;
    for (rapidjson::SizeType i = 0; i < acc.Size(); ++i) {
        double a = std::round(d * acc[i].GetDouble());
        g_spec_per_pos[i] += a;
        accepted += static_cast<int64_t>(a);
    }
    g_spec_drafts += d;
    g_spec_draft_tokens += d * acc.Size();
    return {static_cast<int64_t>(d * acc.Size()), accepted};
}

std::string spec_metrics() {
    std::lock_guard lock(g_spec_mutex);
    std::string m = "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n# TYPE vllm:spec_decode_num_drafts_total counter\n";
    auto line = [&](const std::string& name, const std::string& labels, double v) {
        char b[64];
        std::snprintf(b, sizeof b, "%.1f", v);
        m += name + "{engine=\"0\",model_name=\"fake\"" + labels + "} " + b + "\n";
    };
    line("vllm:spec_decode_num_drafts_total", "", g_spec_drafts);
    line("vllm:spec_decode_num_draft_tokens_total", "", g_spec_draft_tokens);
    double acc = 0;
    for (double a : g_spec_per_pos) acc += a;
    line("vllm:spec_decode_num_accepted_tokens_total", "", acc);
    for (size_t i = 0; i < g_spec_per_pos.size(); ++i)
        line("vllm:spec_decode_num_accepted_tokens_per_pos_total", ",position=\"" + std::to_string(i) + "\"", g_spec_per_pos[i]);
    m += "vllm:num_requests_running{engine=\"0\",model_name=\"fake\"} 0.0\n";
    return m;
}

std::mutex g_cache_mutex;
std::vector<std::string> g_seen_prompts;  // the simulated prefix cache

// Longest common prefix with any prompt seen before, then remember this one.
size_t cached_prefix(const std::string& prompt) {
    std::lock_guard lock(g_cache_mutex);
    size_t best = 0;
    for (const auto& p : g_seen_prompts) {
        size_t n = 0;
        while (n < p.size() && n < prompt.size() && p[n] == prompt[n]) ++n;
        best = std::max(best, n);
    }
    g_seen_prompts.push_back(prompt);
    return best;
}

std::string dump(const rapidjson::Value& v) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    v.Accept(w);
    return {b.GetString(), b.GetSize()};
}

std::string quote(const std::string& s) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.String(s.c_str(), static_cast<rapidjson::SizeType>(s.size()));
    return {b.GetString(), b.GetSize()};
}

void record(const std::string& line) {
    if (g_record.empty()) return;
    std::lock_guard lock(g_record_mutex);
    std::ofstream(g_record, std::ios::app) << line << "\n";
}

int64_t get_int(const rapidjson::Value& o, const char* k, int64_t d) {
    auto it = o.FindMember(k);
    return it != o.MemberEnd() && it->value.IsInt64() ? it->value.GetInt64() : d;
}

bool script_flag(const char* k) {
    auto it = g_script.FindMember(k);
    return it != g_script.MemberEnd() && it->value.IsTrue();
}
std::string get_str(const rapidjson::Value& o, const char* k, const std::string& d = "") {
    auto it = o.FindMember(k);
    return it != o.MemberEnd() && it->value.IsString() ? it->value.GetString() : d;
}

// Splits text into word-sized pieces, keeping the spaces.
std::vector<std::string> words(const std::string& text) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find(' ', pos);
        end = end == std::string::npos ? text.size() : end + 1;
        out.push_back(text.substr(pos, end - pos));
        pos = end;
    }
    return out;
}

// The next tick of the process-wide decode-step clock ("step_ms").
std::chrono::steady_clock::time_point next_step(int64_t step_ms) {
    static const auto epoch = std::chrono::steady_clock::now();
    const auto step = std::chrono::milliseconds(step_ms);
    return epoch + step * ((std::chrono::steady_clock::now() - epoch) / step + 1);
}

class Handler : public Poco::Net::HTTPRequestHandler {
public:
    // llama-server's /apply-template: the chat request rendered as the prompt it would complete
    // (here a stand-in: the messages' text and the generation prompt the thinking switch picks).
    static std::string rendered(const rapidjson::Value& rq) {
        std::string p;
        if (rq.IsObject() && rq.HasMember("messages") && rq["messages"].IsArray())
            for (const auto& m : rq["messages"].GetArray())
                if (m.IsObject() && m.HasMember("content") && m["content"].IsString())
                    p += "<|im_start|>" + get_str(m, "role") + "\n" + m["content"].GetString() + "<|im_end|>\n";
        const bool thinking = !(rq.IsObject() && rq.HasMember("chat_template_kwargs") && rq["chat_template_kwargs"].IsObject() &&
                                rq["chat_template_kwargs"].HasMember("enable_thinking") && rq["chat_template_kwargs"]["enable_thinking"].IsFalse());
        return p + "<|im_start|>assistant\n" + (thinking ? "<think>\n" : "<think>\n\n</think>\n\n");
    }
    void apply_template(const rapidjson::Value& rq, Poco::Net::HTTPServerResponse& resp) {
        std::string b = R"({"prompt":)" + quote(rendered(rq)) + "}";
        resp.setContentType("application/json");
        resp.sendBuffer(b.data(), b.size());
    }

    // vLLM's /tokenize of a chat request: the prompt's ids as its chat endpoint would have them
    // (here: 7 for each word of the stand-in rendering, then 3 when the template closed the
    // thinking block, else 2).
    void tokenize(const rapidjson::Value& rq, Poco::Net::HTTPServerResponse& resp) {
        const std::string text = rendered(rq), closed = "</think>\n\n";
        std::string ids;
        for (size_t i = 0; i < words(text).size(); ++i) ids += "7,";
        const bool is_closed = text.size() >= closed.size() && text.compare(text.size() - closed.size(), closed.size(), closed) == 0;
        ids += is_closed ? "3" : "2";
        std::string b = R"({"count":)" + std::to_string(words(text).size() + 1) + R"(,"max_model_len":)" + g_max_model_len +
                        R"(,"tokens":[)" + ids + R"(],"token_strs":null})";
        resp.setContentType("application/json");
        resp.sendBuffer(b.data(), b.size());
    }

    // llama-server's /v1/completions, as a raw completion for a token-exact resume reads it: the
    // model's whole output is the turn's reasoning, "\n</think>\n\n" and its content (or the
    // content alone when the prompt closed the thinking block), one word a token, token i having
    // id 1000 + i. A prompt array [text, ids...] continues after those ids, which must be the
    // script's own (else a 400 naming the first wrong one). With "verbose" each chunk carries
    // __verbose {tokens, tokens_predicted}. Turn options: die_after (on a plain prompt only, as a
    // drop), "hole_at": N (the chunk of token N is not sent, as llama-server sends none for a token
    // that ends inside a UTF-8 character: the next chunk carries its text, not its id).
    // vLLM flavor: the prompt is ids (/tokenize's, then the continuation's), and with
    // return_token_ids each choice carries token_ids (the first chunk prompt_token_ids too).
    void raw_completion(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp, const rapidjson::Value& rq,
                        const rapidjson::Value& turn) {
        const auto& prompt = rq["prompt"];
        const bool vllm = g_flavor == "vllm";
        std::string text = prompt.IsString() ? prompt.GetString() : prompt.IsArray() && prompt.Size() && prompt[0].IsString() ? prompt[0].GetString() : "";
        // Where the rendered prompt ends and the continuation's ids begin.
        rapidjson::SizeType cont = prompt.IsArray() ? 1 : 0;
        bool closed_by_template = false;
        if (vllm) {
            while (cont < prompt.Size() && prompt[cont].IsInt() && prompt[cont].GetInt() < 1000) ++cont;
            closed_by_template = cont > 0 && prompt[cont - 1].IsInt() && prompt[cont - 1].GetInt() == 3;
        } else {
            const std::string closed = "</think>\n\n";  // the thinking block the template closed itself
            closed_by_template = text.size() >= closed.size() && text.compare(text.size() - closed.size(), closed.size(), closed) == 0;
        }
        std::vector<std::string> toks;
        if (!closed_by_template) {
            for (auto& w : words(get_str(turn, "reasoning"))) toks.push_back(w);
            toks.push_back("\n</think>\n\n");
        }
        for (auto& w : words(get_str(turn, "content"))) toks.push_back(w);
        size_t from = 0;
        const bool plain = prompt.IsString() || (prompt.IsArray() && cont == prompt.Size());
        if (prompt.IsArray())
            for (rapidjson::SizeType i = cont; i < prompt.Size(); ++i, ++from)
                if (!prompt[i].IsInt() || prompt[i].GetInt() != static_cast<int>(1000 + from)) {
                    std::string b = R"({"error":{"code":400,"message":"fake: the continuation's token )" + std::to_string(from) +
                                    R"( is not the script's","type":"invalid_request_error"}})";
                    resp.setStatus(Poco::Net::HTTPResponse::HTTP_BAD_REQUEST);
                    resp.setContentType("application/json");
                    resp.sendBuffer(b.data(), b.size());
                    return;
                }
        const bool verbose = !vllm && rq.HasMember("verbose") && rq["verbose"].IsTrue();
        const bool ids = vllm && rq.HasMember("return_token_ids") && rq["return_token_ids"].IsTrue();
        const int64_t max_tokens = get_int(rq, "max_tokens", -1);
        const int64_t die_after = plain ? get_int(turn, "die_after", -1) : -1;
        const int64_t hole = plain && !vllm ? get_int(turn, "hole_at", -1) : -1;
        const int64_t step = get_int(g_script, "step_ms", 0);
        resp.setContentType("text/event-stream");
        resp.setChunkedTransferEncoding(true);
        std::ostream& out = resp.send();
        auto chunk_vllm = [&](const std::string& t, const std::string& finish, const std::string& choice_tail) {
            out << R"(data: {"id":"cmpl-fake","object":"text_completion","created":1790000000,"model":"m","choices":[{"index":0,"text":)" << quote(t)
                << R"(,"logprobs":null,"finish_reason":)" << finish << R"(,"stop_reason":null)" << choice_tail << "}]}\n\n";
            out.flush();
        };
        auto chunk = [&](const std::string& t, const std::string& finish, const std::string& tail) {
            out << R"(data: {"object":"text_completion","choices":[{"text":)" << quote(t) << R"(,"index":0,"logprobs":null,"finish_reason":)"
                << finish << "}]" << tail << "}\n\n";
            out.flush();
        };
        int64_t n = 0;
        std::string pending;
        for (size_t i = from; i < toks.size(); ++i) {
            if (max_tokens >= 0 && n >= max_tokens) break;
            if (n == die_after) {
                ::shutdown(static_cast<Poco::Net::HTTPServerRequestImpl&>(req).socket().impl()->sockfd(), SHUT_RDWR);
                resp.setKeepAlive(false);
                return;
            }
            ++n;
            if (step) std::this_thread::sleep_until(next_step(step));
            if (static_cast<int64_t>(i) == hole) {
                pending += toks[i];
                continue;
            }
            if (vllm)
                chunk_vllm(pending + toks[i], "null", ids ? R"(,"token_ids":[)" + std::to_string(1000 + i) + "]" : "");
            else
                chunk(pending + toks[i], "null",
                      verbose ? R"(,"__verbose":{"tokens":[)" + std::to_string(1000 + i) + R"(],"tokens_predicted":)" + std::to_string(n) + "}" : "");
            pending.clear();
        }
        const bool cut = from + static_cast<size_t>(n) < toks.size();
        const int64_t ptok = static_cast<int64_t>(vllm ? prompt.Size() : words(text).size() + from);
        const std::string usage = R"("usage":{"completion_tokens":)" + std::to_string(n) + R"(,"prompt_tokens":)" + std::to_string(ptok) +
                                  R"(,"total_tokens":)" + std::to_string(n + ptok) + R"(,"prompt_tokens_details":{"cached_tokens":0}})";
        if (vllm) {  // the finish, then usage alone (stream_options.include_usage)
            chunk_vllm("", cut ? R"("length")" : R"("stop")", ids ? R"(,"token_ids":[])" : "");
            out << R"(data: {"id":"cmpl-fake","object":"text_completion","created":1790000000,"model":"m","choices":[],)" << usage << "}\n\n";
        } else {
            chunk("", cut ? R"("length")" : R"("stop")", "," + usage);
        }
        out << "data: [DONE]\n\n";
        out.flush();
    }

    void handleRequest(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp) override {
        std::string path = req.getURI();
        if (still_loading()) {
            std::string b = R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error"}})";
            std::string discard((std::istreambuf_iterator<char>(req.stream())), {});
            resp.setStatus(Poco::Net::HTTPResponse::HTTP_SERVICE_UNAVAILABLE);
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            return;
        }
        if (req.getMethod() == "GET") {
            if (path == "/health") {
                resp.setStatus(Poco::Net::HTTPResponse::HTTP_OK);
                resp.setContentLength(0);
                resp.send();
                return;
            }
            if (path == "/metrics") {
                std::string m = spec_metrics();
                resp.setContentType("text/plain; version=0.0.4");
                resp.sendBuffer(m.data(), m.size());
                return;
            }
            if (path == "/props" && g_flavor == "llamacpp") {  // llama-server: parallel slots (-np)
                if (script_flag("slot_save")) record(R"({"cache_request":"GET /props"})");
                std::string v = R"({"total_slots":)" + std::to_string(get_int(g_script, "slots", 4)) + R"(,"model_path":"fake.gguf"})";
                resp.setContentType("application/json");
                resp.sendBuffer(v.data(), v.size());
                return;
            }
            if (path == "/version") {
                std::string v = R"({"version":"0.0.0-fake"})";
                resp.setContentType("application/json");
                resp.sendBuffer(v.data(), v.size());
                return;
            }
            std::string body = R"({"object":"list","data":[{"id":")" + g_served_name +
                               R"(","object":"model","owned_by":")" + (g_check_model ? "vllm" : "fake-any-name") + R"(","max_model_len":)" + g_max_model_len + "}]}";
            resp.setContentType("application/json");
            resp.sendBuffer(body.data(), body.size());
            return;
        }
        std::string body((std::istreambuf_iterator<char>(req.stream())), {});
        if (path.rfind("/slots", 0) == 0 && g_flavor == "llamacpp" && script_flag("slot_save")) {  // as with --slot-save-path
            record(R"({"cache_request":"POST )" + path + R"("})");
            const bool save = path.find("action=save") != std::string::npos;
            const std::string slot = path.substr(7, path.find('?') - 7);
            std::string b = R"({"id_slot":)" + slot + (save ? R"(,"n_saved":0,"n_written":0})" : R"(,"n_restored":0,"n_read":0})");
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            return;
        }
        if (path.rfind("/slots", 0) == 0) {  // llama-server slot actions, as without --slot-save-path
            std::string b = R"({"error":{"code":501,"message":"This server does not support slots action. Start it with `--slot-save-path`","type":"not_supported_error"}})";
            resp.setStatus(Poco::Net::HTTPResponse::HTTP_NOT_IMPLEMENTED);
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            return;
        }
        record(body);
        rapidjson::Document rq;
        rq.Parse(body.c_str());
        int tools_seen = 0;
        if (rq.IsObject() && rq.HasMember("messages") && rq["messages"].IsArray())
            for (const auto& m : rq["messages"].GetArray())
                if (m.IsObject() && get_str(m, "role") == "tool") ++tools_seen;
        const auto& turns = g_script["turns"];
        const rapidjson::Value* picked = nullptr;
        for (const auto& t : turns.GetArray())
            if (!picked && t.HasMember("match") && t["match"].IsString() && body.find(t["match"].GetString()) != std::string::npos &&
                (!t.HasMember("tools_seen") || get_int(t, "tools_seen", -1) == tools_seen))
                picked = &t;
        const auto& turn = picked ? *picked
                                  : turns[static_cast<rapidjson::SizeType>(std::min<int>(tools_seen, static_cast<int>(turns.Size()) - 1))];
        if (g_flavor == "llamacpp" && path == "/apply-template") return apply_template(rq, resp);
        if (g_flavor == "vllm" && path == "/tokenize") return tokenize(rq, resp);
        if (path == "/apply-template") {  // vLLM has no such route
            std::string b = R"({"detail":"Not Found"})";
            resp.setStatus(Poco::Net::HTTPResponse::HTTP_NOT_FOUND);
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            return;
        }
        if (rq.IsObject() && rq.HasMember("prompt") && path.size() >= 12 &&
            path.compare(path.size() - 12, 12, "/completions") == 0)
            return raw_completion(req, resp, rq, turn);
        // llama-server started without a vision projector (--mmproj): an image is a 500, every time.
        auto has_image = [&] {
            if (!rq.IsObject() || !rq.HasMember("messages") || !rq["messages"].IsArray()) return false;
            for (const auto& m : rq["messages"].GetArray())
                if (m.IsObject() && m.HasMember("content") && m["content"].IsArray())
                    for (const auto& part : m["content"].GetArray())
                        if (part.IsObject() && get_str(part, "type") == "image_url") return true;
            return false;
        };
        if (g_flavor == "llamacpp" && !(g_script.HasMember("vision") && g_script["vision"].IsTrue()) && has_image()) {
            std::string b = R"({"error":{"code":500,"message":"image input is not supported - hint: if this is unexpected, you may need to provide the mmproj","type":"server_error"}})";
            resp.setStatus(Poco::Net::HTTPResponse::HTTP_INTERNAL_SERVER_ERROR);
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            record(R"({"served":0,"status":500})");
            return;
        }
        // llama-server's chat-template check (server-common.cpp): the request is refused before
        // anything is generated.
        if (g_flavor == "llamacpp" && rq.IsObject() && rq.HasMember("messages") && rq["messages"].IsArray()) {
            const auto& ms = rq["messages"].GetArray();
            auto role = [&](rapidjson::SizeType i) { return ms[i].IsObject() ? get_str(ms[i], "role") : std::string(); };
            if (ms.Size() >= 2 && role(ms.Size() - 1) == "assistant" && role(ms.Size() - 2) == "assistant") {
                std::string b = R"({"error":{"code":400,"message":"Cannot have 2 or more assistant messages at the end of the list.","type":"invalid_request_error"}})";
                resp.setStatus(Poco::Net::HTTPResponse::HTTP_BAD_REQUEST);
                resp.setContentType("application/json");
                resp.sendBuffer(b.data(), b.size());
                return;
            }
        }
        // Continuation: what the answer continues from, and on which channel.
        bool continuing = false, echo = false, cont_reasoning = false;
        std::string pre_reasoning, pre_content;
        if (rq.IsObject() && rq.HasMember("messages") && rq["messages"].IsArray() && !rq["messages"].Empty()) {
            const auto& last = rq["messages"].GetArray()[rq["messages"].Size() - 1];
            bool agp = !(rq.HasMember("add_generation_prompt") && rq["add_generation_prompt"].IsFalse());
            const rapidjson::Value* cf = rq.HasMember("continue_final_message") ? &rq["continue_final_message"] : nullptr;
            std::string cmode = !cf ? "" : cf->IsTrue() ? "auto" : cf->IsString() ? cf->GetString() : "";
            if (g_flavor == "llamacpp" && cmode != "auto" && cmode != "content" && cmode != "reasoning_content") cmode.clear();
            if (g_script.HasMember("legacy_prefill") && g_script["legacy_prefill"].IsTrue()) cmode.clear();
            auto refuse = [&](const std::string& msg) {
                std::string b = R"({"error":{"code":400,"message":)" + quote(msg) + R"(,"type":"invalid_request_error"}})";
                resp.setStatus(Poco::Net::HTTPResponse::HTTP_BAD_REQUEST);
                resp.setContentType("application/json");
                resp.sendBuffer(b.data(), b.size());
                record(R"({"served":0,"status":400})");
            };
            if (!cmode.empty() && agp)
                return refuse(g_flavor == "llamacpp" ? "Cannot set both add_generation_prompt and continue_final_message to true."
                                                     : "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
            bool assistant_last = last.IsObject() && get_str(last, "role") == "assistant";
            if (assistant_last && (!cmode.empty() || g_flavor == "llamacpp")) {
                if (g_flavor == "llamacpp" && last.HasMember("tool_calls") && last["tool_calls"].IsArray() && !last["tool_calls"].Empty())
                    return refuse("Cannot continue an assistant message that contains tool calls.");
                continuing = true;
                echo = cmode.empty();  // llama-server's implicit prefill repeats itself
                pre_content = get_str(last, "content");
                pre_reasoning = get_str(last, "reasoning_content", get_str(last, "reasoning"));
                if (g_flavor == "llamacpp")
                    cont_reasoning = cmode == "reasoning_content" || ((cmode.empty() || cmode == "auto") && !pre_reasoning.empty() && pre_content.empty());
            }
        }
        // vLLM serves only its --served-model-name: another model is a 404 (checked when the
        // test names one with --served-name; otherwise any model is taken).
        if (g_flavor == "vllm" && g_check_model && rq.IsObject() && get_str(rq, "model") != g_served_name) {
            std::string b = R"({"error":{"message":"The model `)" + get_str(rq, "model") +
                            R"(` does not exist.","type":"NotFoundError","param":null,"code":404}})";
            resp.setStatus(Poco::Net::HTTPResponse::HTTP_NOT_FOUND);
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            record(R"({"served":0,"status":404})");
            return;
        }
        if (g_flavor == "vllm" && rq.IsObject() && rq.HasMember("thinking_token_budget") &&
            !(g_script.HasMember("reasoning_config") && g_script["reasoning_config"].IsTrue())) {
            std::string b = R"({"error":{"message":"thinking_token_budget is set but reasoning_config is not configured. Please set --reasoning-config to use thinking_token_budget.","type":"BadRequestError","param":null,"code":400}})";
            resp.setStatus(Poco::Net::HTTPResponse::HTTP_BAD_REQUEST);
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            record(R"({"served":0,"status":400})");
            return;
        }
        int served = ++g_served;
        if (served <= get_int(g_script, "fail_first", 0)) {
            int64_t st = get_int(g_script, "fail_status", 503);
            std::string b = R"({"error":{"message":"scripted startup failure","type":"ServiceUnavailable","code":503}})";
            resp.setStatus(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(st));
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            record(R"({"served":)" + std::to_string(served) + R"(,"status":)" + std::to_string(st) + "}");
            return;
        }
        int64_t prefix_cached = -1, uncached = 0, prompt_tokens = static_cast<int64_t>(body.size() / 4);
        if (g_script.HasMember("prefix_cache") && g_script["prefix_cache"].IsTrue() && rq.IsObject() && rq.HasMember("messages")) {
            std::string prompt_text = dump(rq["messages"]);
            prefix_cached = static_cast<int64_t>(cached_prefix(prompt_text) / 4);
            prompt_tokens = static_cast<int64_t>(prompt_text.size() / 4);  // what the cache is measured on
            uncached = std::max<int64_t>(0, prompt_tokens - prefix_cached);
        }

        if (int64_t stall = get_int(turn, "head_stall_ms", 0)) std::this_thread::sleep_for(std::chrono::milliseconds(stall));
        if (int64_t status = get_int(turn, "status", 0)) {
            std::string b = get_str(turn, "body", R"({"error":{"message":"scripted failure","type":"ServiceUnavailable","code":503}})");
            if (int64_t ra = get_int(turn, "retry_after", 0)) resp.set("Retry-After", std::to_string(ra));
            resp.setStatus(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(status));
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            record(R"({"served":)" + std::to_string(served) + R"(,"status":)" + std::to_string(status) + "}");
            return;
        }

        if (rq.IsObject() && rq.HasMember("stream") && rq["stream"].IsFalse()) {
            std::string calls;
            int n = 0;
            if (turn.HasMember("tool_calls"))
                for (const auto& tc : turn["tool_calls"].GetArray()) {
                    std::string args = tc["arguments"].IsString() ? tc["arguments"].GetString() : dump(tc["arguments"]);
                    calls += std::string(n ? "," : "") + R"({"id":"chatcmpl-tool-)" + std::to_string(served) + "-" + std::to_string(n) +
                             R"(","type":"function","function":{"name":)" + quote(tc["name"].GetString()) + R"(,"arguments":)" + quote(args) + "}}";
                    ++n;
                }
            std::string content = get_str(turn, "content"), reasoning = get_str(turn, "reasoning");
            // vLLM honours a named tool_choice with structured output: the answer is that call.
            if (g_flavor == "vllm" && rq.HasMember("tool_choice") && rq["tool_choice"].IsObject() && rq["tool_choice"].HasMember("function") &&
                rq["tool_choice"]["function"].IsObject()) {
                calls = R"({"id":"chatcmpl-tool-)" + std::to_string(served) + R"(-0","type":"function","function":{"name":)" +
                        quote(get_str(rq["tool_choice"]["function"], "name")) + R"(,"arguments":"{}"}})";
                n = 1;
                content.clear();
                reasoning.clear();
            }
            int64_t completion = static_cast<int64_t>(words(content).size() + words(reasoning).size()) + n;
            // max_tokens as the servers apply it to a whole answer: the output stops there
            // (reasoning first, then content; calls are lost), finish_reason "length".
            bool cut = false;
            if (const int64_t cap = get_int(rq, "max_tokens", -1); cap >= 0 && completion > cap) {
                auto r = words(reasoning), c = words(content);
                const size_t keep_r = std::min<size_t>(r.size(), static_cast<size_t>(cap));
                const size_t keep_c = std::min<size_t>(c.size(), static_cast<size_t>(cap) - keep_r);
                reasoning.clear();
                for (size_t i = 0; i < keep_r; ++i) reasoning += r[i];
                content.clear();
                for (size_t i = 0; i < keep_c; ++i) content += c[i];
                calls.clear();
                n = 0;
                completion = cap;
                cut = true;
            }
            std::string b = R"({"id":"chatcmpl-fake)" + std::to_string(served) + R"(","object":"chat.completion","model":)" +
                            quote(rq.IsObject() ? get_str(rq, "model", "fake") : "fake") + R"(,"choices":[{"index":0,"message":{"role":"assistant","content":)" +
                            (content.empty() && n ? "null" : quote(content)) + (reasoning.empty() ? "" : R"(,"reasoning":)" + quote(reasoning)) +
                            (n ? R"(,"tool_calls":[)" + calls + "]" : "") + R"(},"finish_reason":)" + quote(cut ? "length" : n ? "tool_calls" : "stop") +
                            R"(}],"usage":{"prompt_tokens":)" + std::to_string(prompt_tokens) + R"(,"completion_tokens":)" + std::to_string(completion) +
                            R"(,"total_tokens":)" + std::to_string(prompt_tokens + completion) + "}}";
            resp.setStatus(Poco::Net::HTTPResponse::HTTP_OK);
            resp.setContentType("application/json");
            resp.sendBuffer(b.data(), b.size());
            record(R"({"served":)" + std::to_string(served) + R"(,"whole":true})");
            return;
        }
        resp.setStatus(Poco::Net::HTTPResponse::HTTP_OK);
        resp.setContentType("text/event-stream");
        resp.setChunkedTransferEncoding(true);
        std::ostream& out = resp.send();
        if (turn.HasMember("drop_after_head") && turn["drop_after_head"].IsTrue()) {
            out.flush();
            // Cut the connection under POCO: the client sees the head, then EOF with no event
            // and no last chunk (a server killed between accepting and generating).
            ::shutdown(static_cast<Poco::Net::HTTPServerRequestImpl&>(req).socket().impl()->sockfd(), SHUT_RDWR);
            record(R"({"served":)" + std::to_string(served) + R"(,"dropped":true})");
            return;
        }
        int64_t delay = get_int(turn, "delay_ms", get_int(g_script, "delay_ms", 0));
        // Prefill is paid for the tokens the cache did not have, before the first chunk.
        if (int64_t us = uncached * get_int(g_script, "prefill_us_per_token", 0)) {
            static std::mutex prefill;
            std::lock_guard lock(prefill);
            std::this_thread::sleep_for(std::chrono::microseconds(us));
        }
        int64_t first_delay = get_int(turn, "first_delay_ms", 0);
        const int64_t step = get_int(g_script, "step_ms", 0);
        size_t split = static_cast<size_t>(get_int(g_script, "split", 8));
        std::string model = rq.IsObject() ? get_str(rq, "model", "fake") : "fake";
        std::string head = R"({"id":"chatcmpl-fake)" + std::to_string(served) +
                           R"(","object":"chat.completion.chunk","created":1790000000,"model":)" + quote(model) + R"(,"choices":)";
        int chunks = 0;
        bool gone = false;
        auto send = [&](const std::string& data) {
            if (gone) return;
            if (chunks == 0 && first_delay) std::this_thread::sleep_for(std::chrono::milliseconds(first_delay));
            else if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            else if (step) std::this_thread::sleep_until(next_step(step));
            out << "data: " << data << "\n\n";
            out.flush();
            if (!out.good()) gone = true;
            else ++chunks;
        };
        // llama-server's counts: with "timings_per_token" every chunk carries timings, and
        // predicted_n counts tokens that produced no delta too (the end of the thinking block).
        const bool per_token = g_flavor == "llamacpp" && rq.IsObject() && rq.HasMember("timings_per_token") && rq["timings_per_token"].IsTrue();
        int64_t generated = 0;
        auto timings = [&] {
            return R"("timings":{"cache_n":)" + std::to_string(std::max<int64_t>(prefix_cached, 0)) + R"(,"prompt_n":)" +
                   std::to_string(prompt_tokens - std::max<int64_t>(prefix_cached, 0)) + R"(,"predicted_n":)" + std::to_string(generated) + "}";
        };
        auto delta = [&](const std::string& d, const std::string& finish = "null") {
            send(head + R"([{"index":0,"delta":)" + d + R"(,"logprobs":null,"finish_reason":)" + finish + "}]" +
                 (per_token ? "," + timings() : "") + "}");
        };

        // llama-server's prefill progress (asked with return_progress): role-only chunks with
        // "prompt_progress", one per batch, then the answer. "stall_after_steps" stops them
        // there for "stall_ms" while the HTTP side goes on answering (an engine that stalled).
        if (g_flavor == "llamacpp" && rq.IsObject() && rq.HasMember("return_progress") && rq["return_progress"].IsTrue() &&
            turn.HasMember("progress") && turn["progress"].IsObject()) {
            const auto& pg = turn["progress"];
            const int64_t total = get_int(pg, "total", 1000), steps = std::max<int64_t>(get_int(pg, "steps", 10), 1);
            const int64_t every = get_int(pg, "every_ms", 100), stall_after = get_int(pg, "stall_after_steps", -1);
            for (int64_t i = 0; i <= steps && !gone; ++i) {
                if (i == stall_after) std::this_thread::sleep_for(std::chrono::milliseconds(get_int(pg, "stall_ms", 60000)));
                out << "data: " << head << R"([{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}],"prompt_progress":{"total":)"
                    << total << R"(,"cache":0,"processed":)" << total * i / steps << R"(,"time_ms":)" << every * i << "}}\n\n";
                out.flush();
                if (!out.good()) gone = true;
                if (i < steps) std::this_thread::sleep_for(std::chrono::milliseconds(every));
            }
        }
        delta(R"({"role":"assistant","content":""})");
        if (turn.HasMember("stream_error")) {
            send(R"({"error":{"message":)" + quote(get_str(turn, "stream_error")) + R"(,"type":"InternalServerError","code":500}})");
            out << "data: [DONE]\n\n";
            out.flush();
            record(R"({"served":)" + std::to_string(served) + R"(,"chunks":)" + std::to_string(chunks) + "}");
            return;
        }
        std::string rfield = get_str(turn, "reasoning_field", g_flavor == "llamacpp" ? "reasoning_content" : "reasoning");
        // What the model says: the scripted turn, or for a continuation what follows the prefill
        // (a model that was not where the prefill says answers as scripted).
        auto rest = [](const std::string& all, const std::string& done) {
            return all.rfind(done, 0) == 0 ? all.substr(done.size()) : all;
        };
        std::string say_reasoning = get_str(turn, "reasoning"), say_content = get_str(turn, "content");
        if (continuing) {
            say_reasoning = cont_reasoning ? rest(say_reasoning, pre_reasoning) : "";
            if (!cont_reasoning) say_content = rest(say_content, pre_content);
        }
        // Failing mid-stream, after die_after output deltas.
        const int64_t die_after = continuing && !(turn.HasMember("die_on_continuation") && turn["die_on_continuation"].IsTrue())
                                      ? -1
                                      : get_int(turn, "die_after", -1);
        const std::string die = get_str(turn, "die", "drop");
        // The request's token limit, as the real servers apply it: one output delta is one token
        // here; past the limit nothing more is said and the finish reason is "length".
        const int64_t max_tokens = rq.IsObject() ? get_int(rq, "max_tokens", -1) : -1;
        int outputs = 0;
        bool died = false, cut = false;
        auto output = [&](const std::string& d) {
            if (died || cut) return;
            if (outputs == die_after) {
                died = true;
                record(R"({"served":)" + std::to_string(served) + R"(,"chunks":)" + std::to_string(chunks) + R"(,"died":)" + quote(die) + "}");
                if (die == "kill") ::kill(::getpid(), SIGKILL);
                if (die == "error") {
                    send(R"({"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"InternalServerError","code":500}})");
                    out << "data: [DONE]\n\n";
                    out.flush();
                } else if (die == "malformed") {
                    send(R"({"id":"chatcmpl-x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"cut)");
                    out << "data: [DONE]\n\n";
                    out.flush();
                } else if (die == "stall") {
                    std::this_thread::sleep_for(std::chrono::milliseconds(get_int(turn, "stall_ms", 60000)));
                } else {
                    out.flush();
                    ::shutdown(static_cast<Poco::Net::HTTPServerRequestImpl&>(req).socket().impl()->sockfd(), SHUT_RDWR);
                }
                return;
            }
            // Past the limit (a server killed after its last allowed token dies above instead).
            if (max_tokens >= 0 && outputs >= max_tokens) {
                cut = true;
                return;
            }
            ++outputs;
            ++generated;
            delta(d);
        };
        int completion = 0, reasoning_tokens = 0;
        {
            const bool honoured = g_flavor == "llamacpp" || (g_script.HasMember("reasoning_config") && g_script["reasoning_config"].IsTrue());
            const char* field = g_flavor == "llamacpp" ? "reasoning_budget_tokens" : "thinking_token_budget";
            if (int64_t budget = rq.IsObject() ? get_int(rq, field, -1) : -1; honoured && budget >= 0) {
                std::string kept;
                int64_t n = 0;
                for (const auto& w : words(say_reasoning))
                    if (n++ < budget) kept += w;
                say_reasoning = kept;
            }
        }
        if (echo && !pre_reasoning.empty()) say_reasoning = pre_reasoning + say_reasoning;
        if (echo && !cont_reasoning && !pre_content.empty()) say_content = pre_content + say_content;
        auto pieces = [&](const std::string& text, const std::string& echoed) {
            // The echo arrives whole in the first delta, as llama-server's first diff carries it.
            std::vector<std::string> ws = words(text.substr(echoed.size()));
            if (!echoed.empty()) {
                if (ws.empty()) ws.push_back(echoed);
                else ws.front() = echoed + ws.front();
            }
            return ws;
        };
        for (const auto& w : pieces(say_reasoning, echo ? pre_reasoning : "")) {
            output("{" + quote(rfield) + ":" + quote(w) + "}");
            ++completion;
            ++reasoning_tokens;
        }
        // The end of a thinking block ("</think>", "\n\n") is two tokens that make no delta.
        if (g_flavor == "llamacpp" && !say_reasoning.empty() && !died && !cut) {
            generated += 2;
            completion += 2;
            reasoning_tokens += 2;
        }
        for (const auto& w : pieces(say_content, echo && !cont_reasoning ? pre_content : "")) {
            output(R"({"content":)" + quote(w) + "}");
            ++completion;
        }
        int ncalls = 0;
        if (turn.HasMember("tool_calls")) {
            for (const auto& tc : turn["tool_calls"].GetArray()) {
                std::string args = tc["arguments"].IsString() ? tc["arguments"].GetString() : dump(tc["arguments"]);
                std::string idx = std::to_string(ncalls);
                output(R"({"tool_calls":[{"index":)" + idx + R"(,"id":"chatcmpl-tool-)" + std::to_string(served) + "-" + idx +
                       R"(","type":"function","function":{"name":)" + quote(tc["name"].GetString()) + R"(,"arguments":""}}]})");
                for (size_t p = 0; p < args.size(); p += split)
                    output(R"({"tool_calls":[{"index":)" + idx + R"(,"function":{"arguments":)" + quote(args.substr(p, split)) + "}}]}");
                completion += static_cast<int>(args.size() / 4 + 1);
                ++ncalls;
            }
        }
        if (died) {
            resp.setKeepAlive(false);
            return;
        }
        if (turn.HasMember("truncate") && turn["truncate"].IsTrue()) {
            // Die mid-stream: no finish, no usage, no [DONE].
            record(R"({"served":)" + std::to_string(served) + R"(,"chunks":)" + std::to_string(chunks) + R"(,"truncated":true})");
            resp.setKeepAlive(false);
            return;
        }
        std::string finish = cut ? "length" : get_str(turn, "finish_reason", ncalls ? "tool_calls" : "stop");
        if (cut) completion = outputs, reasoning_tokens = std::min(reasoning_tokens, outputs);
        send(head + R"([{"index":0,"delta":{},"logprobs":null,"finish_reason":)" + quote(finish) + R"(,"stop_reason":null}]})");
        const rapidjson::Value* u = turn.HasMember("usage") ? &turn["usage"] : nullptr;
        int64_t prompt = u ? get_int(*u, "prompt_tokens", 0) : prompt_tokens;
        int64_t comp = u ? get_int(*u, "completion_tokens", completion) : completion;
        int64_t cached = u ? get_int(*u, "cached_tokens", 0) : std::max<int64_t>(prefix_cached, 0);
        int64_t rtok = u ? get_int(*u, "reasoning_tokens", reasoning_tokens) : reasoning_tokens;
        // llama-server's usage has no completion_tokens_details (no reasoning count).
        std::string usage = R"({"prompt_tokens":)" + std::to_string(prompt) + R"(,"completion_tokens":)" + std::to_string(comp) +
                            R"(,"total_tokens":)" + std::to_string(prompt + comp) + R"(,"prompt_tokens_details":{"cached_tokens":)" +
                            std::to_string(cached) + "}" +
                            (g_flavor == "llamacpp" ? std::string() : R"(,"completion_tokens_details":{"reasoning_tokens":)" + std::to_string(rtok) + "}") + "}";
        auto [draft_n, draft_acc] = spec_account();
        std::string draft = draft_n < 0 ? "" : R"(,"draft_n":)" + std::to_string(draft_n) + R"(,"draft_n_accepted":)" + std::to_string(draft_acc);
        if (g_flavor == "llamacpp")
            send(head + R"([],"usage":)" + usage + R"(,"timings":{"cache_n":)" + std::to_string(cached) + R"(,"prompt_n":)" +
                 std::to_string(prompt - cached) + R"(,"predicted_n":)" + std::to_string(comp) + draft + "}}");
        else
            send(head + R"([],"usage":)" + usage + "}");
        if (!gone) {
            out << "data: [DONE]\n\n";
            out.flush();
        }
        record(R"({"served":)" + std::to_string(served) + R"(,"chunks":)" + std::to_string(chunks) + R"(,"client_gone":)" +
               (gone ? "true" : "false") + R"(,"peer_port":)" + std::to_string(req.clientAddress().port()) + "}");
    }
};

class Factory : public Poco::Net::HTTPRequestHandlerFactory {
public:
    Poco::Net::HTTPRequestHandler* createRequestHandler(const Poco::Net::HTTPServerRequest&) override { return new Handler; }
};

}  // namespace

int main(int argc, char** argv) {
    std::string script_path;
    int port = 0;
    int64_t max_model_len = 0;
    CLI::App app{"A scripted stand-in for vLLM (or llama-server: --flavor) on loopback, faults included.", "fake_vllm"};
    pulse::args::style(app);
    app.add_option("--script", script_path, "the turns to play (JSON)")->option_text("FILE")->required();
    app.add_option("--port", port, "the port (0: any; the chosen one is printed)")->option_text("PORT");
    app.add_option("--record", g_record, "append each request received to this file")->option_text("FILE");
    app.add_option("--flavor", g_flavor, "which server's answers to give")->option_text("NAME");
    CLI::Option* served = app.add_option("--served-name", g_served_name, "the one model name served (others get vLLM's 404)")->option_text("NAME");
    app.add_option("--max-model-len", max_model_len, "the context window /v1/models reports")->option_text("N");
    if (auto exit = pulse::args::parse(app, argc, argv)) return *exit;
    g_check_model = served->count() > 0;
    if (max_model_len) g_max_model_len = std::to_string(max_model_len);
    // One bulk copy: scripts of tens of MiB (the slow-client tests) took over the harness's
    // start-up bound read a character at a time in the sanitizer build.
    std::ifstream in(script_path, std::ios::binary);
    std::ostringstream script_text;
    script_text << in.rdbuf();
    const std::string text = std::move(script_text).str();
    g_script.Parse(text.c_str());
    if (g_script.HasParseError() || !g_script.IsObject() || !g_script.HasMember("turns") || !g_script["turns"].IsArray() ||
        g_script["turns"].Empty()) {
        std::fprintf(stderr, "fake_vllm: --script %s must be JSON with a non-empty \"turns\" array\n", script_path.c_str());
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts
    Poco::Net::ServerSocket socket(Poco::Net::SocketAddress("127.0.0.1", static_cast<Poco::UInt16>(port)), 1024);
    auto* params = new Poco::Net::HTTPServerParams;
    params->setMaxThreads(512);
    params->setMaxQueued(512);
    Poco::Net::HTTPServer server(new Factory, socket, params);
    server.start();
    std::printf("fake_vllm listening on 127.0.0.1:%u\n", socket.address().port());
    std::fflush(stdout);
    int sig;
    sigwait(&set, &sig);
    server.stopAll(true);  // like a process that exits: open (keep-alive) connections close now
    return 0;
}
