// Raw completions for a token-exact resume (profile option resume = "tokens").
//
// A Chat Completions stream does not say which tokens produced it: llama-server reports a
// token's id only with a delta, and the end of a thinking block, text its parser holds back and
// the pieces of a character split across tokens make none. Continuing such an answer from its
// text re-tokenizes that text, and a greedy answer then drifts a few tokens after the seam. So a
// request the model's own format can be parsed from goes out as a raw completion of the
// server's rendered prompt (llama-server's /apply-template, asked by the host before the request:
// SDK 1.3 prepare), with every token's id reported (llama-server: `verbose`, each chunk's
// __verbose.tokens; vLLM: return_token_ids, choices[0].token_ids). Pulse parses the text with
// the Qwen3.5 output parser, reports the ids to the host (delta->trail), and a resume sends the
// rendered prompt followed by exactly those ids.
#include <rapidjson/document.h>

#include "chat_translation.h"

namespace pulse::chat {
namespace {

// The request's tools as the parser types call values by: [{"function": {name, parameters}}],
// under the names the backend saw.
rapidjson::Document parser_tools(const RequestInfo& info) {
    rapidjson::Document tools(rapidjson::kArrayType);
    auto& a = tools.GetAllocator();
    for (const auto& [flat, t] : info.tools) {
        rapidjson::Value fn(rapidjson::kObjectType);
        fn.AddMember("name", rapidjson::Value(flat.c_str(), a), a);
        rapidjson::Document params;
        if (!t.params.empty() && !params.Parse(t.params.c_str()).HasParseError() && params.IsObject())
            fn.AddMember("parameters", rapidjson::Value(params, a), a);
        rapidjson::Value tool(rapidjson::kObjectType);
        tool.AddMember("function", fn, a);
        tools.PushBack(tool, a);
    }
    return tools;
}

bool has_image(const Json& input) {
    for (size_t i = 0; i < input.size(); ++i) {
        Json content = input.at(i)["content"];
        for (size_t j = 0; j < content.size(); ++j)
            if (content.at(j)["type"].string_or("") == "input_image") return true;
    }
    return false;
}

}  // namespace

bool raw_eligible(const Options& opt, const Json& req, const RequestInfo& info) {
    if (!opt.token_resume || info.forced.active) return false;
    if (req["text"]["format"]["type"].string_or("") == "json_schema") return false;
    if (info.thinking && req["reasoning"]["budget_tokens"].i64()) return false;  // the server's chat parser enforces it
    return !has_image(req["input"]);
}

bool has_rendered_prompt(const Options& opt, const Json& prepared) {
    return opt.server == Options::Server::llama_server ? prepared["prompt"].is_string() : prepared["tokens"].size() > 0;
}

std::string_view render_path(const Options& opt) {
    // Both at the server's root, whatever prefix its OpenAI routes have.
    return opt.server == Options::Server::llama_server ? "/apply-template" : "/tokenize";
}

void write_render_request(const pulse_host_api_t* host, pulse_call_t* call, const Options& opt, const Json& req, const Json& model,
                          const RequestInfo& info, Writer& w, const Log& log) {
    // llama-server's /apply-template takes the chat request itself; vLLM's /tokenize the parts
    // its chat template reads (it logs every other field as ignored).
    write_request(host, call, opt, req, model, info, w, log, nullptr, opt.server == Options::Server::vllm);
}

void write_raw_request(const Options& opt, const Json& req, const Json& model, const Json& prepared, const Partial* resume,
                       Writer& w) {
    w.begin_object();
    w.kv("model", model["upstream_model"].string_or(model["id"].string_or("")));
    w.key("prompt");
    if (opt.server == Options::Server::llama_server) {
        // The rendered text is tokenized by the server exactly as its chat endpoint would (special
        // tokens parsed); a continuation's ids follow it unchanged (a mixed prompt array).
        std::string_view text = prepared["prompt"].string_or("");
        if (resume && !resume->tokens.empty()) {
            w.begin_array().string(text);
            for (int32_t id : resume->tokens) w.i64(id);
            w.end_array();
        } else {
            w.string(text);
        }
    } else {
        // vLLM: the prompt's ids as its chat endpoint tokenized them, then the continuation's.
        Json ids = prepared["tokens"];
        w.begin_array();
        for (size_t i = 0; i < ids.size(); ++i) w.copy(ids.at(i));
        if (resume)
            for (int32_t id : resume->tokens) w.i64(id);
        w.end_array();
    }
    write_sampling(opt, req, model, resume, w);
    // Every chunk carries its token ids: llama-server's `verbose` (__verbose.tokens), vLLM's
    // return_token_ids (choices[0].token_ids).
    w.key(opt.server == Options::Server::llama_server ? "verbose" : "return_token_ids").boolean(true);
    w.key("stream").boolean(true);
    w.key("stream_options").begin_object().key("include_usage").boolean(true).end_object();
    w.end_object();
    if (!w.ok()) throw Error(PULSE_E_INTERNAL, "writing the upstream request failed");
}

void ChunkTranslator::continue_raw(const Partial& p) {
    auto tools = parser_tools(info_);
    raw_.emplace(&tools, info_.thinking);
    // What the failed stream parsed again: its text and reasoning reached the client already; a
    // tool call it had parsed was still waiting for the end of the answer, and still is.
    for (auto& e : raw_->feed(p.raw))
        if (e.kind == qwen::OutputParser::Event::tool_call) calls_[raw_calls_++] = PendingCall{"", e.name, e.arguments};
}

pulse_status_t ChunkTranslator::raw_events(pulse_call_t*, const std::vector<qwen::OutputParser::Event>& events, pulse_delta_sink_t* sink) {
    const pulse_delta_api_t* d = host_->delta;
    for (const auto& e : events) {
        pulse_status_t s = PULSE_OK;
        if (e.kind == qwen::OutputParser::Event::reasoning) s = d->reasoning(sink, str(e.text));
        else if (e.kind == qwen::OutputParser::Event::content) s = d->text(sink, str(e.text));
        else calls_[raw_calls_++] = PendingCall{"", e.name, e.arguments};  // sent whole at the end, as chat calls are
        if (s != PULSE_OK) return s;
    }
    return PULSE_OK;
}

pulse_status_t ChunkTranslator::feed_raw(pulse_call_t* call, const Json& chunk, pulse_delta_sink_t* sink) {
    const pulse_delta_api_t* d = host_->delta;
    if (!raw_) {
        auto tools = parser_tools(info_);
        raw_.emplace(&tools, info_.thinking);
    }
    Json choice = chunk["choices"].at(0);
    if (choice.present()) {
        std::string text(choice["text"].string_or(""));
        // vLLM: choices[0].token_ids (return_token_ids); llama-server: __verbose.tokens (verbose).
        Json ids = choice["token_ids"].is_array() ? choice["token_ids"] : chunk["__verbose"]["tokens"];
        const bool thinking = raw_->thinking();
        if (pulse_status_t s = raw_events(call, raw_->feed(text), sink); s != PULSE_OK) return s;
        std::vector<int32_t> tokens;
        tokens.reserve(ids.size());
        for (size_t i = 0; i < ids.size(); ++i) tokens.push_back(static_cast<int32_t>(ids.at(i).i64().value_or(-1)));
        raw_tokens_ += static_cast<int64_t>(tokens.size());
        if (thinking) raw_thought_ += static_cast<int64_t>(tokens.size());
        if (PULSE_HAS_FIELD(d, pulse_delta_api_t, trail)) {
            // llama-server sends no chunk for a token that ends inside a UTF-8 character: its
            // count of generated tokens then runs ahead of the ids seen, and the record has a hole.
            auto predicted = chunk["__verbose"]["tokens_predicted"].i64();
            if (!trail_lost_ && predicted && *predicted != raw_tokens_) {
                trail_lost_ = true;
                d->trail_lost(sink, str("the backend generated " + std::to_string(*predicted) + " tokens and reported the ids of " +
                                        std::to_string(raw_tokens_)));
            }
            if (!trail_lost_ && !ids.is_array() && !text.empty()) {
                trail_lost_ = true;
                d->trail_lost(sink, str("the backend reports no token ids (llama-server needs `verbose`, vLLM `return_token_ids`)"));
            }
            if (!trail_lost_) d->trail(sink, tokens.data(), tokens.size(), str(text));
        }
        if (auto f = choice["finish_reason"].string()) finish_ = finish_from(*f);
    }
    if (Json u = chunk["usage"]; !u.is_object() && choice.present()) {
        // The counts so far, exact at any point: a stream that breaks before its usage has its
        // output and reasoning tokens counted from the ids, not guessed from its deltas.
        pulse_usage_t usage{sizeof(pulse_usage_t), -1, -1, raw_tokens_, raw_thought_};
        if (pulse_status_t s = d->usage(sink, &usage); s != PULSE_OK) return s;
    } else if (u.is_object()) {
        pulse_usage_t usage{sizeof(pulse_usage_t), -1, -1, -1, -1};
        usage.input_tokens = u["prompt_tokens"].i64().value_or(-1);
        usage.output_tokens = u["completion_tokens"].i64().value_or(raw_tokens_);
        usage.cached_tokens = u["prompt_tokens_details"]["cached_tokens"].i64().value_or(-1);
        usage.reasoning_tokens = raw_thought_;  // counted by the parser's state, token by token
        if (pulse_status_t s = d->usage(sink, &usage); s != PULSE_OK) return s;
    }
    return PULSE_OK;
}

pulse_status_t ChunkTranslator::finish_raw(pulse_call_t* call, pulse_delta_sink_t* sink) {
    if (pulse_status_t s = raw_events(call, raw_->finish(), sink); s != PULSE_OK) return s;
    if (raw_->broken_call() && finish_ != PULSE_FINISH_LENGTH)
        return host_->delta->error(sink, PULSE_E_UNAVAILABLE, str("the model wrote a tool call that cannot be parsed (Qwen XML format)"));
    return PULSE_OK;
}

}  // namespace pulse::chat
