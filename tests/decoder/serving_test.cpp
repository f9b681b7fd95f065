// The decoder's serving side: the Qwen3.5 chat format (golden renders), the streaming output
// parser (think blocks, XML tool calls, held-back partial tags), the sampler, the engine (queue,
// prefix checkpoints, stop strings, max tokens, cancel), and the backend plugin through a real
// gateway (decoder:// endpoint, /health report).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <fstream>
#include <tuple>

#include <rapidjson/document.h>

#include "qwen_format.h"
#include "serving/engine.h"
#include "support/forwarding_device.h"
#include "support/gateway_harness.h"
#include "tools/synthetic.h"

using namespace pulse::decoder;
using namespace pulse::qwen;
using namespace pulse::test;
namespace fs = std::filesystem;

namespace {

rapidjson::Document json(const std::string& s) {
    rapidjson::Document d;
    d.Parse(s.c_str());
    REQUIRE_MESSAGE(!d.HasParseError(), s);
    return d;
}

const char* kTools = R"([{"type":"function","function":{"name":"shell","description":"Run a command",
  "parameters":{"type":"object","properties":{"cmd":{"type":"string"},"timeout":{"type":"integer"},"env":{"type":"object"}}}}}])";

// Drains a job: every chunk until done (bounded).
std::vector<rapidjson::Document> drain(Job& job) {
    std::vector<rapidjson::Document> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::unique_lock lock(job.mu);
    while (std::chrono::steady_clock::now() < deadline) {
        job.cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return !job.chunks.empty() || job.done; });
        while (!job.chunks.empty()) {
            out.push_back(json(job.chunks.front()));
            job.chunks.pop_front();
        }
        if (job.done) break;
    }
    REQUIRE(job.done);
    return out;
}

// The tiny synthetic model written into `dir`, and engine options for it on one thread.
EngineOptions tiny_model(const fs::path& dir, uint32_t type = kF32) {
    write_synthetic(dir / "t.gguf", tiny_shape(), type, 7);
    EngineOptions o;
    o.model = dir / "t.gguf";
    o.threads = 1;
    return o;
}

struct TinyEngine {
    TempDir d;
    std::unique_ptr<Engine> engine;
    explicit TinyEngine(int64_t max_sequences = 4, uint32_t type = kF32) {
        EngineOptions o = tiny_model(d.path(), type);
        o.max_sequences = max_sequences;
        engine = std::make_unique<Engine>(o);
    }
};

// What a request streamed: its reasoning and content text, finish reason and usage.
struct Answer {
    std::string reasoning, content, finish;
    int completion = -1, prompt = -1;
    bool operator==(const Answer&) const = default;
};
Answer answer(const std::vector<rapidjson::Document>& chunks) {
    Answer a;
    for (const auto& c : chunks) {
        if (c.HasMember("usage")) {
            a.completion = c["usage"]["completion_tokens"].GetInt();
            a.prompt = c["usage"]["prompt_tokens"].GetInt();
        }
        if (!c["choices"].Size()) continue;
        const auto& ch = c["choices"][0];
        if (ch["delta"].HasMember("reasoning_content")) a.reasoning += ch["delta"]["reasoning_content"].GetString();
        if (ch["delta"].HasMember("content")) a.content += ch["delta"]["content"].GetString();
        if (ch["finish_reason"].IsString()) a.finish = ch["finish_reason"].GetString();
    }
    return a;
}

}  // namespace

TEST_CASE("chat format: system, tools, a tool loop and thinking render as the Qwen3.5 template does") {
    auto req = json(std::string(R"({"messages":[
      {"role":"system","content":"Be brief."},
      {"role":"user","content":"List files"},
      {"role":"assistant","content":"","reasoning_content":"I will run ls.","tool_calls":[{"id":"c1","type":"function","function":{"name":"shell","arguments":"{\"cmd\":\"ls\",\"timeout\":5}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"a.txt"},
      {"role":"tool","tool_call_id":"c2","content":"b.txt"}],
      "tools":)") + kTools + "}");
    bool thinking = false;
    std::string p = render_chat(req, &thinking);
    CHECK(thinking);
    std::string want_head = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
                            "{\"type\":\"function\",\"function\":{\"name\":\"shell\"";
    CHECK(p.rfind(want_head, 0) == 0);
    CHECK(p.find("</IMPORTANT><|im_end|>\n<|im_start|>user\nList files<|im_end|>\n") != std::string::npos);
    // The reasoning of a turn after the last user message is kept; its call renders as XML.
    CHECK(p.find("<|im_start|>assistant\n<think>\nI will run ls.\n</think>\n\n<tool_call>\n<function=shell>\n"
                 "<parameter=cmd>\nls\n</parameter>\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call><|im_end|>\n") !=
          std::string::npos);
    // Consecutive tool results share one user turn.
    CHECK(p.find("<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\nb.txt\n</tool_response><|im_end|>\n") !=
          std::string::npos);
    CHECK(p.rfind("<|im_start|>assistant\n<think>\n") == p.size() - std::string("<|im_start|>assistant\n<think>\n").size());
}

TEST_CASE("chat format: thinking off, reasoning of earlier turns dropped, no tools, bad input refused") {
    auto req = json(R"({"chat_template_kwargs":{"enable_thinking":false},"messages":[
      {"role":"user","content":[{"type":"text","text":"hi"}]},
      {"role":"assistant","content":"hello","reasoning_content":"old thoughts"},
      {"role":"user","content":"again"}]})");
    bool thinking = true;
    std::string p = render_chat(req, &thinking);
    CHECK_FALSE(thinking);
    CHECK(p == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"
               "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    CHECK_THROWS_WITH_AS(render_chat(json(R"({"messages":[{"role":"narrator","content":"x"}]})")), doctest::Contains("role 'narrator'"),
                         std::invalid_argument);
    CHECK_THROWS_AS(render_chat(json(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1"}}]}]})")),
                    std::invalid_argument);
}

TEST_CASE("chat format: continue_final_message continues the last assistant message inside its reasoning or after its content") {
    const std::string head = R"({"continue_final_message":true,"add_generation_prompt":false,"messages":[{"role":"user","content":"hi"},)";
    bool thinking = false;
    // Reasoning only: the think block stays open and the output is reasoning.
    std::string p = render_chat(json(head + R"({"role":"assistant","content":"","reasoning_content":"First I"}]})"), &thinking);
    CHECK(thinking);
    CHECK(p == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nFirst I");
    // Content: the reasoning is closed, the content continues, the output is content.
    p = render_chat(json(head + R"({"role":"assistant","content":"The answer","reasoning_content":"Easy."}]})"), &thinking);
    CHECK_FALSE(thinking);
    CHECK(p == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nEasy.\n</think>\n\nThe answer");
    CHECK_THROWS_WITH_AS(render_chat(json(R"({"continue_final_message":true,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}]})")),
                         doctest::Contains("add_generation_prompt: false"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(render_chat(json(head + R"({"role":"user","content":"x"}]})")), doctest::Contains("not an assistant message"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(render_chat(json(head + R"({"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]})")),
                         doctest::Contains("tool calls"), std::invalid_argument);
}

TEST_CASE("output parser: think block, text, a typed XML tool call, fed one character at a time") {
    auto tools = json(kTools);
    OutputParser p(&tools, true);
    std::string out = "Let me look.\n</think>\n\nChecking <b> now.\n<tool_call>\n<function=shell>\n<parameter=cmd>\nls -la\n</parameter>\n"
                      "<parameter=timeout>\n30\n</parameter>\n<parameter=env>\n{\"A\": 1}\n</parameter>\n</function>\n</tool_call>";
    std::string reasoning, content;
    std::vector<OutputParser::Event> calls;
    for (char c : out)
        for (auto& e : p.feed(std::string(1, c))) {
            if (e.kind == OutputParser::Event::reasoning) reasoning += e.text;
            else if (e.kind == OutputParser::Event::content) content += e.text;
            else calls.push_back(e);
            CHECK(e.text.find("<tool") == std::string::npos);  // a partial tag never leaks
        }
    for (auto& e : p.finish()) CHECK(e.kind != OutputParser::Event::tool_call);
    CHECK(reasoning == "Let me look.");
    CHECK(content == "Checking <b> now.");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].name == "shell");
    CHECK(calls[0].arguments == R"({"cmd":"ls -la","timeout":30,"env":{"A":1}})");
    CHECK(p.saw_tool_call());
    CHECK_FALSE(p.broken_call());
}

TEST_CASE("output parser: an unterminated call is dropped and flagged; a lone '<' is text") {
    OutputParser p(nullptr, false);
    std::string content;
    for (auto& e : p.feed("a < b <tool_call>\n<function=f>\n<parameter=x>\n1")) content += e.text;
    for (auto& e : p.finish()) content += e.text;
    CHECK(content == "a < b");
    CHECK(p.broken_call());
    CHECK_FALSE(p.saw_tool_call());
}

TEST_CASE("sampler: greedy is argmax; a seed makes sampling reproducible; top-k 1 and min-p 1 are greedy") {
    std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.f, 1.95f};
    CHECK(Sampler({}).sample(logits.data(), 5) == 1);
    SamplerParams sp;
    sp.temperature = 1.0;
    sp.seed = 7;
    Sampler a(sp), b(sp);
    std::vector<int32_t> xa, xb;
    for (int i = 0; i < 50; ++i) xa.push_back(a.sample(logits.data(), 5)), xb.push_back(b.sample(logits.data(), 5));
    CHECK(xa == xb);
    CHECK(std::set<int32_t>(xa.begin(), xa.end()).size() > 1);  // it does sample
    sp.top_k = 1;
    Sampler k1(sp);
    for (int i = 0; i < 20; ++i) CHECK(k1.sample(logits.data(), 5) == 1);
    sp.top_k = 0;
    sp.min_p = 1.0;
    Sampler m1(sp);
    for (int i = 0; i < 20; ++i) CHECK(m1.sample(logits.data(), 5) == 1);
}

TEST_CASE("engine: streams Chat Completions chunks with usage; the next turn reuses the prefix") {
    TinyEngine t;
    auto req = R"({"model":"tiny","max_tokens":6,"temperature":0,"chat_template_kwargs":{"enable_thinking":false},
                   "messages":[{"role":"user","content":"hello there"}]})";
    auto job = t.engine->submit(json(req));
    auto chunks = drain(*job);
    REQUIRE(chunks.size() >= 3);
    CHECK(std::string(chunks[0]["choices"][0]["delta"]["role"].GetString()) == "assistant");
    const auto& usage = chunks.back()["usage"];
    CHECK(usage["prompt_tokens"].GetInt() == static_cast<int>(job->tokens.size()));
    CHECK(usage["prompt_tokens_details"]["cached_tokens"].GetInt() == 0);
    int completion = usage["completion_tokens"].GetInt();
    CHECK(completion >= 1);
    CHECK(completion <= 7);
    std::string finish = chunks[chunks.size() - 2]["choices"][0]["finish_reason"].GetString();
    CHECK((finish == "length" || finish == "stop"));
    // Same conversation again: everything but the last prompt token comes from a checkpoint.
    auto again = t.engine->submit(json(req));
    auto chunks2 = drain(*again);
    CHECK(chunks2.back()["usage"]["prompt_tokens_details"]["cached_tokens"].GetInt() == static_cast<int>(again->tokens.size()) - 1);
    // Greedy and from the same state: the same text.
    auto text = [](const std::vector<rapidjson::Document>& cs) {
        std::string s;
        for (const auto& c : cs)
            if (c["choices"].Size() && c["choices"][0]["delta"].HasMember("content")) s += c["choices"][0]["delta"]["content"].GetString();
        return s;
    };
    CHECK(text(chunks) == text(chunks2));
}

TEST_CASE("engine: a reasoning budget closes the think block after that many tokens; the answer follows") {
    TinyEngine t;
    auto run = [&](const std::string& budget) {
        auto job = t.engine->submit(json(R"({"max_tokens":40,"temperature":1,"seed":3,"messages":[{"role":"user","content":"think"}])" + budget + "}"));
        std::string reasoning, content;
        for (const auto& c : drain(*job)) {
            if (!c["choices"].Size()) continue;
            const auto& d = c["choices"][0]["delta"];
            if (d.HasMember("reasoning_content")) reasoning += d["reasoning_content"].GetString();
            if (d.HasMember("content")) content += d["content"].GetString();
        }
        return std::make_pair(reasoning, content);
    };
    // Not structured bindings: Clang 14 refuses one in CAPTURE's lambda.
    const std::string free_reasoning = run("").first;
    const auto budgeted = run(R"(,"thinking_token_budget":5)");
    const std::string& reasoning = budgeted.first;
    const std::string& content = budgeted.second;
    CAPTURE(free_reasoning);
    CAPTURE(reasoning);
    // Seeded: the same tokens until the budget, then "</think>" by force and the answer.
    REQUIRE(free_reasoning.size() > reasoning.size());  // unbudgeted, the random model thinks on
    CHECK(free_reasoning.rfind(reasoning.substr(0, reasoning.size() / 2), 0) == 0);
    CHECK(!content.empty());
    // llama-server's field name works too.
    CHECK(run(R"(,"reasoning_budget_tokens":5)").first == reasoning);
}

TEST_CASE("engine: max tokens ends with length; an over-long prompt is refused before any output; cancel stops") {
    TinyEngine t;
    auto job = t.engine->submit(json(R"({"max_tokens":3,"temperature":0,"messages":[{"role":"user","content":"x"}]})"));
    auto chunks = drain(*job);
    CHECK(chunks.back()["usage"]["completion_tokens"].GetInt() <= 4);
    std::string big(5000, 'z');  // 1 token per byte here: over the 4096-token context
    CHECK_THROWS_WITH_AS(t.engine->submit(json(R"({"messages":[{"role":"user","content":")" + big + R"("}]})")),
                         doctest::Contains("maximum context length is 4096 tokens"), std::length_error);
    auto long_job = t.engine->submit(json(R"({"max_tokens":3000,"temperature":1,"seed":3,"messages":[{"role":"user","content":"go"}]})"));
    long_job->cancelled = true;
    drain(*long_job);
    CHECK(long_job->done);
}

TEST_CASE("engine: up to max_sequences requests run at once, each answered as if alone; more wait; a cancel leaves the rest") {
    for (uint32_t type : {kF32, kQ8_0}) {
        CAPTURE(type_name(type));
        std::vector<std::string> reqs;
        for (int i = 0; i < 5; ++i)
            reqs.push_back(R"({"max_tokens":)" + std::to_string(20 + 3 * i) + R"(,"temperature":0,"messages":[{"role":"user","content":"request )" +
                           std::string(static_cast<size_t>(1 + 7 * i), static_cast<char>('a' + i)) + R"("}]})");
        // One at a time: the reference answers.
        std::vector<Answer> alone;
        Engine::Stats one_stats;
        {
            TinyEngine one(1, type);
            for (const auto& r : reqs) alone.push_back(answer(drain(*one.engine->submit(json(r)))));
            one_stats = one.engine->stats();
        }
        CHECK(one_stats.peak_batch == 1);
        TinyEngine t(3, type);
        CHECK(t.engine->max_sequences() == 3);
        std::vector<rapidjson::Document> docs;
        for (const auto& r : reqs) docs.push_back(json(r));
        auto jobs = t.engine->submit_all(std::move(docs));  // queued together: no race with the engine
        for (size_t i = 0; i < jobs.size(); ++i) {
            CAPTURE(i);
            CHECK(answer(drain(*jobs[i])) == alone[i]);
        }
        for (int i = 0; i < 200 && t.engine->active() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        CHECK(t.engine->active() == 0);
        // Three were served per step (never more), the same tokens in far fewer steps.
        auto st = t.engine->stats();
        CHECK(st.peak_batch == 3);
        CHECK(st.decode_rows == one_stats.decode_rows);
        CHECK(st.prompt_rows == one_stats.prompt_rows);
        CHECK(st.steps * 3 < one_stats.steps * 2);
        CHECK(st.decode_only_rows > 0);
        CHECK(st.decode_only_rows <= st.decode_rows);
        CHECK(st.decode_only_s > 0);
        MESSAGE("steps one at a time " << one_stats.steps << ", three at a time " << st.steps);

        // A request cancelled while others run beside it: it stops, they are unchanged.
        const uint64_t rows_before = t.engine->stats().decode_rows;
        auto endless = t.engine->submit(json(R"({"max_tokens":3000,"temperature":0,"messages":[{"role":"user","content":"go on"}]})"));
        std::vector<std::shared_ptr<Job>> beside;
        for (int i = 3; i < 5; ++i) beside.push_back(t.engine->submit(json(reqs[static_cast<size_t>(i)])));
        // Cancelled a few steps in, while the other two still run (they need 30 and 33 tokens).
        for (int i = 0; i < 2000 && t.engine->stats().decode_rows < rows_before + 9; ++i) std::this_thread::sleep_for(std::chrono::microseconds(500));
        endless->cancelled = true;
        auto cut = answer(drain(*endless));
        CHECK(cut.finish.empty());  // no finish reason, no usage: it ended where it was cut
        CHECK(cut.completion == -1);
        CHECK(endless->error.empty());
        CHECK(answer(drain(*beside[0])) == alone[3]);
        CHECK(answer(drain(*beside[1])) == alone[4]);
    }
}

TEST_CASE("engine: ignore_eos generates to max_tokens past the point the model would have stopped") {
    TinyEngine t;
    const std::string req = R"({"max_tokens":80,"temperature":1,"seed":3,"messages":[{"role":"user","content":"go on"}])";
    auto stops = answer(drain(*t.engine->submit(json(req + "}"))));
    REQUIRE(stops.finish == "stop");  // this seed samples an end-of-generation token early
    REQUIRE(stops.completion < 80);
    auto runs = answer(drain(*t.engine->submit(json(req + R"(,"ignore_eos":true})"))));
    CHECK(runs.finish == "length");
    CHECK(runs.completion == 80);
}

TEST_CASE("engine: conversations served side by side each keep their prefix checkpoint (two per sequence slot)") {
    TinyEngine t(4);
    CHECK(t.engine->max_checkpoints() == 8);
    std::vector<std::string> reqs;
    for (int i = 0; i < 4; ++i)
        reqs.push_back(R"({"max_tokens":6,"temperature":0,"messages":[{"role":"user","content":"conversation )" + std::to_string(i) + R"("}]})");
    for (int turn = 0; turn < 2; ++turn) {
        // All four at once (one submit_all): submitted one by one, the first could finish, and
        // its end-of-answer checkpoint push out the oldest, before the last was admitted.
        std::vector<rapidjson::Document> docs;
        for (const auto& r : reqs) docs.push_back(json(r));
        auto jobs = t.engine->submit_all(std::move(docs));
        for (auto& j : jobs) {
            auto chunks = drain(*j);
            const int cached = chunks.back()["usage"]["prompt_tokens_details"]["cached_tokens"].GetInt();
            // The repeat finds everything but its last prompt token (with the old three
            // checkpoints, the fourth conversation's were gone).
            CHECK(cached == (turn == 0 ? 0 : static_cast<int>(j->tokens.size()) - 1));
        }
    }
}

TEST_CASE("engine: speculative decoding (MTP block, draft model, adaptive) in the batched step: every answer as without drafts") {
    // The untied tiny shape (its greedy text varies; the tied one repeats a token), with an MTP
    // block; the draft model is its first layer alone (right about 5 times in 6).
    TempDir d;
    SynthShape shape = tiny_shape();
    shape.tied_output = false;
    shape.mtp = true;
    write_synthetic(d / "m.gguf", shape, kF32, 9);
    shape.n_layer = 1;
    write_synthetic(d / "short.gguf", shape, kF32, 9);
    // A draft vocabulary: every other token of the vocabulary (most of what the model writes is
    // then still drafted, and the rest never is).
    {
        std::ofstream v(d / "vocab.txt");
        for (int t = 0; t < 300; t += 2) v << t << "\n";
    }
    auto options = [&](const std::string& draft, int k, bool adaptive, int64_t max_sequences) {
        EngineOptions o;
        o.model = d / "m.gguf";
        o.threads = 1;
        o.exact = true;
        o.max_sequences = max_sequences;
        o.max_checkpoints = 16;  // every request's two
        o.draft = DraftSetting::parse(draft);
        o.draft_k = k;
        o.draft_adaptive = adaptive;
        return o;
    };
    // Thinking with a budget, max tokens, ignore_eos, a long prompt (prefill in chunks beside
    // decoding requests), plain answers.
    std::vector<std::string> reqs = {
        R"({"max_tokens":40,"temperature":0,"messages":[{"role":"user","content":"first question"}]})",
        R"({"max_tokens":33,"temperature":0,"thinking_token_budget":7,"messages":[{"role":"user","content":"think a little"}]})",
        R"({"max_tokens":25,"temperature":0,"ignore_eos":true,"chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":"go"}]})",
        R"({"max_tokens":30,"temperature":0,"messages":[{"role":"user","content":")" + std::string(300, 'x') + R"("}]})",
        R"({"max_tokens":1,"temperature":0,"messages":[{"role":"user","content":"one token"}]})",
    };
    std::vector<Answer> plain;
    {
        Engine one(options("off", 4, false, 1));
        for (const auto& r : reqs) plain.push_back(answer(drain(*one.submit(json(r)))));
    }
    for (const auto& entry :
         {std::tuple<std::string, int, bool, std::string>{"mtp", 3, false, ""}, {"mtp", 4, false, (d / "vocab.txt").string()},
          {"model:" + (d / "short.gguf").string(), 4, false, ""}, {"model:" + (d / "short.gguf").string(), 6, true, ""}}) {
        // Not a structured binding: Clang 14 refuses one in CAPTURE's lambda.
        const std::string& draft = std::get<0>(entry);
        const int k = std::get<1>(entry);
        const bool adaptive = std::get<2>(entry);
        const std::string& vocab = std::get<3>(entry);
        CAPTURE(draft);
        CAPTURE(k);
        CAPTURE(adaptive);
        CAPTURE(vocab);
        EngineOptions o = options(draft, k, adaptive, 3);
        o.draft_vocab = vocab;
        std::atomic<int64_t> reported_drafts{0}, reported_kept{0};
        o.on_speculation = [&](int64_t drafted, int64_t kept) { reported_drafts += drafted, reported_kept += kept; };
        Engine e(o);
        for (int turn = 0; turn < 2; ++turn) {  // the second turn starts from prefix checkpoints
            std::vector<rapidjson::Document> docs;
            for (const auto& r : reqs) docs.push_back(json(r));
            auto jobs = e.submit_all(std::move(docs));
            for (size_t i = 0; i < jobs.size(); ++i) {
                CAPTURE(i);
                auto chunks = drain(*jobs[i]);
                CHECK(answer(chunks) == plain[i]);
                if (turn == 1) CHECK(chunks.back()["usage"]["prompt_tokens_details"]["cached_tokens"].GetInt() > 0);
            }
        }
        const auto st = e.stats();
        CHECK(st.peak_batch == 3);
        CHECK(st.speculation.steps > 0);
        CHECK(st.speculation.drafted == reported_drafts);
        CHECK(st.speculation.accepted == reported_kept);
        CHECK(st.speculation.accepted <= st.speculation.drafted);
        if (draft != "mtp") CHECK(st.speculation.accepted * 4 > st.speculation.drafted);  // the one-layer drafter is often right
        if (!vocab.empty()) CHECK(e.model().mtp_vocab() == 150);
        MESSAGE(draft << " k " << k << std::string(adaptive ? " adaptive" : "") << std::string(vocab.empty() ? "" : " draft vocabulary") << ": " << st.speculation.accepted << " of " << st.speculation.drafted
                      << " drafts kept in " << st.speculation.steps << " steps; " << st.steps << " engine steps");
    }
}

TEST_CASE("engine: a draft setting the model cannot serve is refused at start, by name") {
    TempDir d;
    write_synthetic(d / "plain.gguf", tiny_shape(), kF32, 7);
    EngineOptions o;
    o.model = d / "plain.gguf";
    o.threads = 1;
    o.draft = DraftSetting::parse("mtp");
    CHECK_THROWS_WITH(Engine{o}, doctest::Contains("has no MTP block"));
    o.draft = DraftSetting::parse("model:" + (d / "missing.gguf").string());
    CHECK_THROWS_WITH(Engine{o}, doctest::Contains("missing.gguf"));
    o.draft = DraftSetting::parse("model:" + (d / "plain.gguf").string());
    o.draft_k = 17;
    CHECK_THROWS_WITH(Engine{o}, doctest::Contains("draft_k must be 1 to 16"));
    o.draft_k = 4;
    o.draft_vocab = (d / "vocab.txt").string();
    CHECK_THROWS_WITH(Engine{o}, doctest::Contains("draft_vocab goes with draft = \"mtp\""));
    SynthShape with_block = tiny_shape();
    with_block.mtp = true;
    write_synthetic(d / "mtp.gguf", with_block, kF32, 7);
    o.model = d / "mtp.gguf";
    o.draft = DraftSetting::parse("mtp");
    CHECK_THROWS_WITH(Engine{o}, doctest::Contains("cannot read"));
    std::ofstream(d / "vocab.txt") << "1\n2\n99999\n";
    CHECK_THROWS_WITH(Engine{o}, doctest::Contains("vocab.txt:3: token 99999 is outside"));
}

TEST_CASE("engine: submit_all queues all or none") {
    TinyEngine t;
    std::vector<rapidjson::Document> docs;
    docs.push_back(json(R"({"max_tokens":2,"messages":[{"role":"user","content":"fine"}]})"));
    docs.push_back(json(R"({"messages":[{"role":"nobody","content":"x"}]})"));
    CHECK_THROWS_AS(t.engine->submit_all(std::move(docs)), std::invalid_argument);
    CHECK(t.engine->queued() == 0);
    CHECK(t.engine->stats().steps == 0);  // the good one was not run either
}

TEST_CASE("scripted model: a tool call first, the answer once a tool result is in the prompt") {
    TempDir d;
    const std::string call = "<tool_call>\n<function=shell>\n<parameter=cmd>\necho hi > f.txt\n</parameter>\n</function>\n</tool_call>";
    write_scripted_model(d / "s.gguf", ScriptedAnswers{call, "Done: f.txt holds hi."});
    EngineOptions o;
    o.model = d / "s.gguf";
    o.threads = 1;
    Engine e(o);
    auto tools = std::string(R"(,"tools":)") + kTools;
    auto call_of = [](const std::vector<rapidjson::Document>& chunks) {
        std::string name, args, finish;
        for (const auto& c : chunks) {
            if (!c["choices"].Size()) continue;
            const auto& ch = c["choices"][0];
            if (ch["delta"].HasMember("tool_calls")) {
                name = ch["delta"]["tool_calls"][0]["function"]["name"].GetString();
                args = ch["delta"]["tool_calls"][0]["function"]["arguments"].GetString();
            }
            if (ch["finish_reason"].IsString()) finish = ch["finish_reason"].GetString();
        }
        return std::make_tuple(name, args, finish);
    };
    auto first = drain(*e.submit(json(std::string(R"({"temperature":0,"chat_template_kwargs":{"enable_thinking":false},
        "messages":[{"role":"user","content":"make f.txt"}])") + tools + "}")));
    auto [name, args, finish] = call_of(first);
    CHECK(name == "shell");
    CHECK(args == R"({"cmd":"echo hi > f.txt"})");
    CHECK(finish == "tool_calls");
    CHECK(first.back()["usage"]["completion_tokens"].GetInt() == 2);  // the answer's token and the end
    auto second = answer(drain(*e.submit(json(std::string(R"({"temperature":0,"chat_template_kwargs":{"enable_thinking":false},
        "messages":[{"role":"user","content":"make f.txt"},
          {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"shell","arguments":"{\"cmd\":\"echo hi > f.txt\"}"}}]},
          {"role":"tool","tool_call_id":"c1","content":"no output"}])") + tools + "}"))));
    CHECK(second.content == "Done: f.txt holds hi.");
    CHECK(second.finish == "stop");
    // A long conversation before the result does not dilute the flag.
    std::string filler;
    for (int i = 0; i < 300; ++i) filler += "lorem ipsum dolor sit amet ";
    auto long_first = drain(*e.submit(json(R"({"temperature":0,"chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":")" +
                                                filler + R"("}])" + tools + "}")));
    CHECK(std::get<0>(call_of(long_first)) == "shell");
    CHECK(long_first.back()["usage"]["prompt_tokens"].GetInt() > 2000);
}

namespace {
// The CPU device, except that a matmul throws once when asked to (a device out of memory, say).
class FailOnceDevice : public ForwardingDevice {
public:
    explicit FailOnceDevice(std::atomic<bool>& fail) : fail_(fail) {}
    const char* name() const override { return "fail-once"; }
    void matmul(const Matrix& w, DevPtr x, int64_t B, DevPtr y, bool i8) const override {
        if (fail_.exchange(false)) throw std::runtime_error("device out of memory");
        ForwardingDevice::matmul(w, x, B, y, i8);
    }

private:
    std::atomic<bool>& fail_;
};
}  // namespace

TEST_CASE("engine: a step that fails on the device fails the requests in flight; the queued one is served after") {
    TempDir d;
    write_synthetic(d / "t.gguf", tiny_shape(), kF32, 7);
    const std::string later = R"({"max_tokens":12,"temperature":0,"messages":[{"role":"user","content":"after the failure"}]})";
    Answer want;
    {
        TinyEngine one(1);
        want = answer(drain(*one.engine->submit(json(later))));
    }
    std::atomic<bool> fail{false};
    EngineOptions o;
    o.model = d / "t.gguf";
    o.threads = 1;
    o.max_sequences = 2;
    Engine e(o, std::make_unique<FailOnceDevice>(fail));
    std::vector<rapidjson::Document> docs;
    for (int i = 0; i < 2; ++i) docs.push_back(json(R"({"max_tokens":3000,"ignore_eos":true,"temperature":0,"messages":[{"role":"user","content":"long )" + std::to_string(i) + R"("}]})"));
    docs.push_back(json(later));
    auto jobs = e.submit_all(std::move(docs));
    for (int i = 0; i < 2000 && e.stats().decode_rows < 10; ++i) std::this_thread::sleep_for(std::chrono::microseconds(500));
    REQUIRE(e.queued() == 1);  // the third waits for a slot
    fail = true;
    for (int i = 0; i < 2; ++i) {
        drain(*jobs[static_cast<size_t>(i)]);
        CHECK(jobs[static_cast<size_t>(i)]->error_status != 0);
        CHECK(jobs[static_cast<size_t>(i)]->error == "decoder: device out of memory");
    }
    CHECK(answer(drain(*jobs[2])) == want);
    CHECK(jobs[2]->error.empty());
}

namespace {
// The CPU device, recording which threads prepared the weights and which ran the matmuls.
class ThreadRecordingDevice : public ForwardingDevice {
public:
    const char* name() const override { return "thread-recording"; }
    const void* prepare(const Matrix& w, Use use) override {
        note(prepared_);
        return ForwardingDevice::prepare(w, use);
    }
    void matmul(const Matrix& w, DevPtr x, int64_t B, DevPtr y, bool i8) const override {
        note(ran_);
        ForwardingDevice::matmul(w, x, B, y, i8);
    }
    std::set<std::thread::id> prepared() const {
        std::lock_guard lock(mu_);
        return prepared_;
    }
    std::set<std::thread::id> ran() const {
        std::lock_guard lock(mu_);
        return ran_;
    }

private:
    void note(std::set<std::thread::id>& s) const {
        std::lock_guard lock(mu_);
        s.insert(std::this_thread::get_id());
    }
    mutable std::mutex mu_;
    mutable std::set<std::thread::id> prepared_, ran_;
};
}  // namespace

// One thread does all of the model's device work: the load's parallel loops (repacking) on
// another thread gave libgomp a second team, throttled its spin, and made every parallel region
// of every step pay futex wake-ups (40k context switches for 128 tokens on 2 CPUs).
TEST_CASE("engine: the model is loaded on the thread that runs its steps, not the caller's") {
    TempDir d;
    const EngineOptions o = tiny_model(d.path(), kQ8_0);
    auto dev = std::make_unique<ThreadRecordingDevice>();
    auto* rec = dev.get();
    Engine e(o, std::move(dev));
    auto out = answer(drain(*e.submit(json(R"({"max_tokens":4,"temperature":0,"messages":[{"role":"user","content":"hi"}]})"))));
    CHECK(out.completion > 0);
    const auto prepared = rec->prepared(), ran = rec->ran();
    REQUIRE(prepared.size() == 1);
    REQUIRE(ran.size() == 1);
    CHECK(*prepared.begin() == *ran.begin());
    CHECK(*prepared.begin() != std::this_thread::get_id());
}

namespace {
class NoMemoryDevice : public ForwardingDevice {
public:
    const char* name() const override { return "no-memory"; }
    const void* prepare(const Matrix&, Use) override { throw std::runtime_error("out of device memory"); }
};
}  // namespace

// A model the engine cannot load fails its constructor with the load's own error, raised on the
// engine's thread and carried over; that thread is joined, nothing is left running.
TEST_CASE("engine: a load that fails on the engine's thread throws from the constructor") {
    TempDir d;
    EngineOptions o = tiny_model(d.path(), kQ8_0);
    CHECK_THROWS_WITH_AS(Engine(o, std::make_unique<NoMemoryDevice>()), "out of device memory", std::runtime_error);
    o.model = d / "missing.gguf";
    CHECK_THROWS_AS(Engine{o}, GgufError);
}

TEST_CASE("engine: max_sequences outside 1..32 is refused at start") {
    TempDir d;
    write_synthetic(d / "t.gguf", tiny_shape(), kF32, 7);
    for (int64_t n : {0, 33}) {
        EngineOptions o;
        o.model = d / "t.gguf";
        o.max_sequences = n;
        CHECK_THROWS_WITH_AS(Engine{o}, ("max_sequences must be 1 to 32, not " + std::to_string(n)).c_str(), std::invalid_argument);
    }
}

TEST_CASE("backend plugin through the gateway: a decoder:// endpoint answers, /health reports the queue and concurrency") {
    TempDir d;
    write_synthetic(d / "tiny.gguf", tiny_shape(), kF32, 7);
    Gateway gw("[models.tiny]\nprofile = \"qwen38\"\n[[models.tiny.endpoints]]\nname = \"local\"\nurl = \"decoder://" + (d / "tiny.gguf").string() +
               "\"\n[models.tiny.endpoints.options]\nmax_sequences = 2\n[models.tiny.sampling]\nmax_output_tokens = 8\n[models.tiny.profile_options]\nthinking = \"off\"\n");
    auto r = post(gw.port, "/v1/responses", R"({"model":"tiny","input":"hi","stream":false,"store":false})");
    REQUIRE_MESSAGE(r.status == 200, r.body << gw.log());
    auto resp = json(r.body);
    std::string status = resp["status"].GetString();
    CHECK((status == "completed" || status == "incomplete"));
    CHECK(resp["usage"]["input_tokens"].GetInt() > 5);
    // Two streams at once through the plugin (that one step serves both is the engine tests' part).
    std::vector<std::thread> clients;
    std::vector<int> codes(2);
    for (int i = 0; i < 2; ++i)
        clients.emplace_back([&, i] {
            codes[static_cast<size_t>(i)] =
                post(gw.port, "/v1/responses", R"({"model":"tiny","input":"stream )" + std::to_string(i) + R"(","stream":true,"store":false,"max_output_tokens":64})")
                    .status;
        });
    for (auto& c : clients) c.join();
    CHECK(codes == std::vector<int>{200, 200});
    // The backend's own report is in /health (probes run every 0.2 s in the harness).
    std::string health;
    for (int i = 0; i < 50; ++i) {
        Poco::Net::HTTPClientSession s("127.0.0.1", gw.port);
        Poco::Net::HTTPRequest req("GET", "/health", Poco::Net::HTTPMessage::HTTP_1_1);
        s.sendRequest(req);
        Poco::Net::HTTPResponse resp2;
        health.assign(std::istreambuf_iterator<char>(s.receiveResponse(resp2)), {});
        // a probe after the requests
        if (health.find(R"("queued":0,"active":0,"concurrency":2)") != std::string::npos && health.find(R"("steps":0,)") == std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK(health.find(R"("backend":{"status":"ok","model":"pulse-synthetic")") != std::string::npos);
    CAPTURE(health);
    CHECK(health.find(R"("queued":0,"active":0,"concurrency":2,"checkpoints":4,"steps":)") != std::string::npos);
    // Which device serves it (cuda where a GPU answered the probe).
    CHECK((health.find(R"("device":"cpu")") != std::string::npos || health.find(R"("device":"cuda")") != std::string::npos));
    CHECK(health.find(R"("steps":0,)") == std::string::npos);
}

TEST_CASE("backend plugin: draft options turn on speculative decoding; /metrics counts drafts, kept drafts and kept by position") {
    TempDir d;
    write_synthetic(d / "tiny.gguf", tiny_shape(), kF32, 7);
    Gateway gw("[models.tiny]\nprofile = \"qwen38\"\n[[models.tiny.endpoints]]\nname = \"local\"\nurl = \"decoder://" + (d / "tiny.gguf").string() +
               "\"\n[models.tiny.endpoints.options]\ndraft = \"model:" + (d / "tiny.gguf").string() +
               "\"\ndraft_k = 3\n[models.tiny.sampling]\nmax_output_tokens = 12\n[models.tiny.profile_options]\nthinking = \"off\"\n");
    auto r = post(gw.port, "/v1/responses", R"({"model":"tiny","input":"hi","stream":false,"store":false,"temperature":0})");
    REQUIRE_MESSAGE(r.status == 200, r.body << gw.log());
    const std::string metrics = get(gw.port, "/metrics");
    CAPTURE(metrics);
    // The model drafting for itself: every draft is kept, at every position.
    auto value = [&](const std::string& series) {
        const size_t at = metrics.find(series + " ");
        return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + series.size() + 1));
    };
    const double steps = value(R"(pulse_decoder_spec_decode_num_drafts_total{plugin="pulse.backend.decoder"})");
    const double drafted = value(R"(pulse_decoder_spec_decode_num_draft_tokens_total{plugin="pulse.backend.decoder"})");
    CHECK(steps >= 2);
    CHECK(drafted == 3 * steps);
    CHECK(value(R"(pulse_decoder_spec_decode_num_accepted_tokens_total{plugin="pulse.backend.decoder"})") == drafted);
    CHECK(value(R"(pulse_decoder_spec_decode_num_accepted_tokens_per_pos_total{plugin="pulse.backend.decoder",position="2"})") == steps);
    CHECK(gw.log().find("speculative decoding with the draft model") != std::string::npos);
}

TEST_CASE("backend plugin: draft_vocab narrows the MTP block's drafts to a file's tokens, said in the log") {
    TempDir d;
    SynthShape shape = tiny_shape();
    shape.mtp = true;
    write_synthetic(d / "mtp.gguf", shape, kF32, 7);
    std::ofstream(d / "vocab.txt") << "# two tokens\n10 5\n11 3\n";
    Gateway gw("[models.tiny]\nprofile = \"qwen38\"\n[[models.tiny.endpoints]]\nname = \"local\"\nurl = \"decoder://" + (d / "mtp.gguf").string() +
               "\"\n[models.tiny.endpoints.options]\ndraft = \"mtp\"\ndraft_vocab = \"" + (d / "vocab.txt").string() +
               "\"\n[models.tiny.sampling]\nmax_output_tokens = 8\n[models.tiny.profile_options]\nthinking = \"off\"\n");
    auto r = post(gw.port, "/v1/responses", R"({"model":"tiny","input":"hi","stream":false,"store":false,"temperature":0})");
    REQUIRE_MESSAGE(r.status == 200, r.body << gw.log());
    CHECK(gw.log().find("drafting among the 2 tokens of " + (d / "vocab.txt").string()) != std::string::npos);
    // first:N instead of a file; a bad N stops the start naming it.
    Gateway first("[models.tiny]\nprofile = \"qwen38\"\n[[models.tiny.endpoints]]\nname = \"local\"\nurl = \"decoder://" + (d / "mtp.gguf").string() +
                  "\"\n[models.tiny.endpoints.options]\ndraft = \"mtp\"\ndraft_vocab = \"first:100\"\n[models.tiny.sampling]\nmax_output_tokens = 8\n"
                  "[models.tiny.profile_options]\nthinking = \"off\"\n");
    auto fr = post(first.port, "/v1/responses", R"({"model":"tiny","input":"hi","stream":false,"store":false,"temperature":0})");
    CHECK_MESSAGE(fr.status == 200, fr.body << first.log());
    CHECK(first.log().find("drafting among the 100 tokens of first:100") != std::string::npos);
}

TEST_CASE("backend plugin: make_demo writes the demo model, or into ~/.cache when the path is not writable") {
    TempDir home;
    std::string old_home = std::getenv("HOME") ? std::getenv("HOME") : "";
    setenv("HOME", home.path().c_str(), 1);  // the gateway child inherits it
    Gateway gw("[models.demo]\nprofile = \"qwen38\"\n[[models.demo.endpoints]]\nname = \"d\"\nurl = \"decoder:///proc/pulse-demo.gguf\"\n"
               "[models.demo.endpoints.options]\nmake_demo = true\n[models.demo.sampling]\nmax_output_tokens = 16\n");
    setenv("HOME", old_home.c_str(), 1);
    auto fallback = home.path() / ".cache/pulse-gateway/pulse-demo.gguf";
    CHECK(fs::exists(fallback));
    CHECK(gw.log().find("cannot write the demo model to /proc/pulse-demo.gguf") != std::string::npos);
    CHECK(gw.log().find("RANDOM weights") != std::string::npos);
    auto r = post(gw.port, "/v1/responses", R"({"model":"demo","input":"hi","stream":false,"store":false})");
    CHECK_MESSAGE(r.status == 200, r.body);
}
