// `pulse bench agent`: scoring on scripted transcripts with known outcomes, the paired
// statistics, the suite format's errors, the shipped suite, and whole runs — two arms against
// the fake backend (one scripted right, one wrong) and the in-process demo model.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <rapidjson/document.h>

#include "pulse-bench/agent.h"
#include "support/gateway_harness.h"

using namespace pulse::bench;
using namespace pulse::bench::agent;
using pulse::test::env_or_fail;
using pulse::test::FakeBackend;
using pulse::test::Gateway;
using pulse::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
}

const char* kTwoCalls = R"({"tasks":[{"id":"t","user":"Make alice@example.com an admin.",
  "tools":[{"name":"lookup_user","parameters":{"type":"object","properties":{"email":{"type":"string"}}}},
           {"name":"set_role","parameters":{"type":"object","properties":{"user_id":{"type":"string"},"role":{"type":"string"}}}}],
  "expect":[{"tool":"lookup_user","args":{"email":{"equals":"alice@example.com"}},"result":{"id":"u_1"}},
            {"tool":"set_role","args":{"user_id":{"equals":"u_1"},"role":{"equals":"admin"}},"result":"ok"}],
  "final":[{"contains":"admin"}]}]})";

Reply calls(std::vector<Call> cs) {
    Reply r;
    r.ok = true;
    r.calls = std::move(cs);
    r.input_tokens = 100;
    r.output_tokens = 10;
    return r;
}
Reply text(const std::string& t) {
    Reply r;
    r.ok = true;
    r.text = t;
    r.input_tokens = 120;
    r.output_tokens = 5;
    return r;
}

// An Ask that plays `replies` in order (and records what it was shown).
struct Script {
    std::vector<Reply> replies;
    size_t next = 0;
    std::vector<Conversation> seen;
    Ask ask() {
        return [this](const Conversation& c) {
            seen.push_back(c);
            return next < replies.size() ? replies[next++] : text("(script ran out)");
        };
    }
};

Result run(const std::string& suite, std::vector<Reply> replies, Script* keep = nullptr) {
    auto tasks = load_suite(suite, "test");
    Script local;
    Script& s = keep ? *keep : local;
    s.replies = std::move(replies);
    return run_task(tasks.at(0), s.ask(), SandboxLimits{});
}

}  // namespace

TEST_CASE("scoring tool-calling transcripts: pass, partial, fail, error, and tool-call errors counted") {
    SUBCASE("every expected call, nothing else, and the answer: pass") {
        Script s;
        Result r = run(kTwoCalls,
                       {calls({{"c1", "lookup_user", R"({"email":"Alice@example.com"})"}}), calls({{"c2", "set_role", R"({"user_id":"u_1","role":"admin"})"}}),
                        text("alice is an admin now")},
                       &s);
        CHECK(r.outcome == "pass");
        CHECK(r.matched == 2);
        CHECK(r.turns == 3);
        CHECK(r.input_tokens == 320);
        CHECK(r.output_tokens == 25);
        // The scripted result went back to the model as the tool's answer.
        REQUIRE(s.seen.size() == 3);
        CHECK(s.seen[1].steps.at(0).results.at(0).second == R"({"id":"u_1"})");
    }
    SUBCASE("an extra call: partial, and counted") {
        Result r = run(kTwoCalls, {calls({{"c1", "lookup_user", R"({"email":"alice@example.com"})"}, {"c9", "lookup_user", R"({"email":"bob@example.com"})"}}),
                                   calls({{"c2", "set_role", R"({"user_id":"u_1","role":"admin"})"}}), text("done, admin")});
        CHECK(r.outcome == "partial");
        CHECK(r.extra_calls == 1);
    }
    SUBCASE("wrong arguments, an unknown tool, unparseable arguments: fail, each error counted") {
        Result r = run(kTwoCalls, {calls({{"c1", "lookup_user", R"({"email":"bob@example.com"})"}}), calls({{"c2", "delete_user", "{}"}}),
                                   calls({{"c3", "set_role", "{not json"}}), text("admin?")});
        CHECK(r.outcome == "fail");
        CHECK(r.matched == 0);
        CHECK(r.extra_calls == 1);
        CHECK(r.unknown_tools == 1);
        CHECK(r.bad_arguments == 1);
    }
    SUBCASE("the calls but not the answer: partial") {
        Result r = run(kTwoCalls, {calls({{"c1", "lookup_user", R"({"email":"alice@example.com"})"}}),
                                   calls({{"c2", "set_role", R"({"user_id":"u_1","role":"admin"})"}}), text("done")});
        CHECK(r.outcome == "partial");
        CHECK(r.detail.find("the answer misses contains \"admin\"") != std::string::npos);  // which check, by name
    }
    SUBCASE("never answering within max_turns: fail") {
        std::vector<Reply> loop(10, calls({{"c", "lookup_user", R"({"email":"x@y"})"}}));
        Result r = run(kTwoCalls, loop);
        CHECK(r.outcome == "fail");
        CHECK(r.turns == 6);
        CHECK(r.detail.find("no final answer within 6 turns") != std::string::npos);
    }
    SUBCASE("a failed request: error, not a model failure") {
        Reply bad;
        bad.error = "HTTP 503: down";
        Result r = run(kTwoCalls, {bad});
        CHECK(r.outcome == "error");
        CHECK(r.detail.find("HTTP 503") != std::string::npos);
    }
    SUBCASE("a task whose right answer calls nothing") {
        const char* none = R"({"tasks":[{"id":"n","user":"2+2?","tools":[{"name":"calculate","parameters":{}}],"final":[{"contains":"4"}]}]})";
        CHECK(run(none, {text("4")}).outcome == "pass");
        CHECK(run(none, {calls({{"c", "calculate", R"({"expression":"2+2"})"}}), text("4")}).outcome == "partial");  // an uncalled-for call
        CHECK(run(none, {text("five")}).outcome == "fail");
    }
}

TEST_CASE("repository tasks: the tools act on the files for real in the sandbox, and the check decides") {
    const char* suite = R"({"tasks":[{"id":"r","kind":"repo","user":"fix it",
      "files":{"calc.py":"def add(a, b):\n    return a - b\n","test_calc.py":"from calc import add\nassert add(2, 3) == 5\n"},
      "check":"grep -q 'a + b' calc.py || exit 1; python3 test_calc.py"}]})";
    Script s;
    Result r = run(suite,
                   {calls({{"c1", "run", R"({"command":"python3 test_calc.py"})"}}), calls({{"c2", "read_file", R"({"path":"calc.py"})"}}),
                    calls({{"c3", "write_file", R"({"path":"calc.py","content":"def add(a, b):\n    return a + b\n"})"}}),
                    calls({{"c4", "run", R"({"command":"python3 test_calc.py && echo fixed"})"}}), text("fixed add")},
                   &s);
    CHECK(r.outcome == "pass");
    REQUIRE(s.seen.size() == 5);
    CHECK(s.seen[1].steps[0].results[0].second.rfind("exit code 1", 0) == 0);  // the test failed before the fix
    CHECK(s.seen[2].steps[1].results[0].second.find("return a - b") != std::string::npos);
    CHECK(s.seen[4].steps[3].results[0].second.rfind("exit code 0\nfixed", 0) == 0);
    // Nothing done: the check fails. Partial is the check's own exit 3.
    Result untouched = run(suite, {text("done")});
    CHECK(untouched.outcome == "fail");
    CHECK(untouched.detail == "the repository was not changed");
    const char* partial = R"({"tasks":[{"id":"p","kind":"repo","user":"x","files":{},"check":"test -f a.txt && exit 0; exit 3"}]})";
    CHECK(run(partial, {calls({{"c", "write_file", R"({"path":"b.txt","content":"x"})"}}), text("wrote it")}).outcome == "partial");
    // A repository left as it was fails even where the check would give partial credit.
    CHECK(run(partial, {text("nothing")}).outcome == "fail");
    // A path out of the repository is refused, not written.
    Script w;
    run(partial, {calls({{"c", "write_file", R"({"path":"../escape.txt","content":"x"})"}}), text("ok")}, &w);
    CHECK(w.seen[1].steps[0].results[0].second.find("must be relative") != std::string::npos);
}

TEST_CASE("paired comparison: counts, the difference with its interval, the exact McNemar p") {
    std::vector<bool> a(10, false), b(10, false);
    for (int i = 0; i < 6; ++i) b[i] = true;  // b passes 6 tasks a fails
    a[9] = b[9] = true;                       // both pass one
    Paired p = compare(a, b);
    CHECK(p.n == 10);
    CHECK(p.both == 1);
    CHECK(p.only_b == 6);
    CHECK(p.only_a == 0);
    CHECK(p.neither == 3);
    CHECK(p.diff == doctest::Approx(0.6));
    CHECK(p.mcnemar_p == doctest::Approx(2 * std::pow(0.5, 6)));  // 6 discordant pairs all one way
    CHECK(p.lo > 0);
    CHECK(p.hi <= 1);
    Paired same = compare(a, a);
    CHECK(same.diff == 0);
    CHECK(same.mcnemar_p == 1);
    std::vector<bool> x = {true, false, true, false}, y = {false, true, false, true};  // 2 each way
    CHECK(compare(x, y).mcnemar_p == doctest::Approx(1.0));
}

TEST_CASE("suite format: precise errors") {
    auto err = [](const std::string& s) {
        try {
            load_suite(s, "suite.json");
        } catch (const std::runtime_error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    CHECK(err("[]") == "suite.json: expected {\"tasks\": [...]}");
    CHECK(err(R"({"tasks":[{"user":"x","tools":[]}]})") == "suite.json: a task has no id");
    CHECK(err(R"({"tasks":[{"id":"a","tools":[]}]})").find("task 'a': \"user\" (the request) is required") != std::string::npos);
    CHECK(err(R"({"tasks":[{"id":"a","user":"x","tools":[],"expect":[{"tool":"nope"}]}]})").find("expects a call to 'nope', which is not among its tools") !=
          std::string::npos);
    CHECK(err(R"({"tasks":[{"id":"a","user":"x","tools":[{"name":"f"}],"expect":[{"tool":"f","args":{"q":{"similar":"x"}}}]}]})")
              .find("unknown check 'similar'") != std::string::npos);
    CHECK(err(R"({"tasks":[{"id":"a","kind":"repo","user":"x","files":{}}]})").find("\"check\" (a shell command) is required") != std::string::npos);
    CHECK(err(R"({"tasks":[{"id":"a","user":"x","tools":[]},{"id":"a","user":"y","tools":[]}]})").find("id used twice") != std::string::npos);
}

TEST_CASE("the shipped suite: at least 300 tool-calling tasks in the BFCL categories and 40 repository tasks, all well formed") {
    auto tasks = load_suite(slurp(PULSE_SOURCE_ROOT "/tools/bench/data/agent_tasks.json"), "agent_tasks.json");
    size_t tools = 0, repo = 0;
    std::map<std::string, int> by_category, smoke;
    for (const auto& t : tasks) {
        (t.kind == "tools" ? tools : repo) += 1;
        by_category[t.category] += 1;
        if (t.smoke) smoke[t.category] += 1;
    }
    CHECK(tools >= 300);
    CHECK(repo >= 40);
    for (const char* c : {"simple", "multiple", "parallel", "parallel_multiple", "irrelevance", "multi_turn", "missing_params", "long_output",
                          "error_recovery", "repo_hidden_tests"}) {
        CAPTURE(c);
        CHECK(by_category[c] >= 10);
        CHECK(smoke[c] == 1);  // the fast subset has one of each
    }
    // "multiple": one tool among at least 20; "long_output": a tool result past 16k tokens (64k characters).
    for (const auto& t : tasks) {
        rapidjson::Document tl;
        tl.Parse(t.tools_json.c_str());
        if (t.category == "multiple") CHECK(tl.Size() >= 20);
        if (t.category == "long_output") CHECK(t.expect.at(0).result.size() > 64000);
    }
    // The file is what the generator makes (tools/bench/gen_agent_suite.py --check).
    auto gen = pulse::test::run({"python3", PULSE_SOURCE_ROOT "/tools/bench/gen_agent_suite.py", "--check"}, {}, 60);
    CHECK_MESSAGE(gen.code == 0, gen.out);
    // No repository task passes untouched (its check fails on the files as given).
    for (const auto& t : tasks) {
        if (t.kind != "repo") continue;
        CAPTURE(t.id);
        Files f = t.files;
        SandboxResult r = run_shell_sandboxed(t.check, f, SandboxLimits{});
        CHECK(r.outcome != Outcome::passed);
        CHECK(r.outcome != Outcome::error);
    }
}

namespace {

struct AgentRun {
    TempDir out;
    pulse::test::Result r;
    rapidjson::Document doc;
    AgentRun(std::vector<std::string> args, bool json = true) {
        std::vector<std::string> argv = {env_or_fail("PULSE_EXE"), "bench", "agent"};
        argv.insert(argv.end(), args.begin(), args.end());
        argv.insert(argv.end(), {"--out", out.path().string()});
        if (json) argv.push_back("--json");
        r = pulse::test::run(argv, {}, 240);
        if (json) doc.Parse(r.out.c_str());
    }
};

const char* kSuite = R"({"tasks":[
 {"id":"weather","user":"What is the weather in Paris?","tools":[{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],
  "expect":[{"tool":"get_weather","args":{"city":{"equals":"Paris"}},"result":{"temp_c":18}}],"final":[{"contains":"18"}]},
 {"id":"sum","user":"Compute 2+2 with the calculator.","tools":[{"name":"calculate","parameters":{"type":"object","properties":{"expression":{"type":"string"}}}}],
  "expect":[{"tool":"calculate","args":{"expression":{"regex":"2\\s*\\+\\s*2"}},"result":"4"}],"final":[{"contains":"4"}]},
 {"id":"capital","user":"Name the capital of Japan.","tools":[{"name":"calculate","parameters":{}}],"final":[{"contains":"Tokyo"}]}]})";

// Per prompt (and tool results so far): the right arm's answers, and the wrong arm's.
const char* kRight = R"({"turns":[
 {"match":"weather in Paris","tools_seen":0,"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]},
 {"match":"weather in Paris","tools_seen":1,"content":"It is 18 C in Paris."},
 {"match":"2+2 with","tools_seen":0,"tool_calls":[{"name":"calculate","arguments":{"expression":"2+2"}}]},
 {"match":"2+2 with","tools_seen":1,"content":"It is 4."},
 {"match":"capital of Japan","content":"Tokyo."},
 {"content":"?"}]})";
const char* kWrong = R"({"turns":[
 {"match":"weather in Paris","tools_seen":0,"tool_calls":[{"name":"get_weather","arguments":{"city":"London"}}]},
 {"match":"weather in Paris","tools_seen":1,"content":"It is mild."},
 {"match":"2+2 with","content":"It is 5."},
 {"match":"capital of Japan","content":"Kyoto."},
 {"content":"?"}]})";

}  // namespace

TEST_CASE("a whole run: the arm scripted right passes every task, the wrong one none, and the comparison says exactly that") {
    FakeBackend right(kRight), wrong(kWrong);
    TempDir d;
    auto suite = d.write("suite.json", kSuite);
    AgentRun run({"--arms", "right=" + right.url() + ",wrong=" + wrong.url(), "--suite", suite.string(), "--seed", "7"});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    auto& doc = run.doc;
    REQUIRE(doc.IsObject());
    const auto& arms = doc["arms"];
    CHECK(arms[0]["pass"].GetInt() == 3);
    CHECK(arms[0]["pass_rate"].GetDouble() == doctest::Approx(1.0));
    CHECK(arms[1]["pass"].GetInt() == 0);
    CHECK(arms[1]["fail"].GetInt() == 3);
    CHECK(arms[1]["tool_call_errors"]["extra_calls"].GetInt() == 1);  // get_weather(London)
    CHECK(arms[0]["input_tokens"].GetInt() > 0);
    const auto& p = doc["pairs"][0];
    CHECK(std::string(p["arm"].GetString()) == "wrong");
    CHECK(std::string(p["baseline"].GetString()) == "right");
    CHECK(p["only_baseline"].GetInt() == 3);
    CHECK(p["only_arm"].GetInt() == 0);
    CHECK(p["pass_rate_difference"].GetDouble() == doctest::Approx(-1.0));
    CHECK(p["mcnemar_p"].GetDouble() == doctest::Approx(0.25));
    CHECK(p["differing_tasks"].Size() == 3);
    // Matched: the same tasks, in the same order, each with one seed on both arms.
    const auto& runs = doc["runs"];
    REQUIRE(runs.Size() == 6);
    CHECK(std::string(runs[0]["task"].GetString()) == "weather");  // listed arm by arm, each in task order
    CHECK(std::string(runs[0]["arm"].GetString()) == "right");
    CHECK(std::string(runs[3]["arm"].GetString()) == "wrong");
    CHECK(std::string(runs[3]["task"].GetString()) == "weather");
    auto seeds = [](const FakeBackend& b) {
        std::vector<int64_t> out;
        for (const auto& q : b.requests()) {
            rapidjson::Document d;
            d.Parse(q.c_str());
            out.push_back(d["seed"].GetInt64());
        }
        return out;
    };
    CHECK(seeds(right) == std::vector<int64_t>{7, 7, 8, 8, 9});
    CHECK(seeds(wrong) == std::vector<int64_t>{7, 7, 8, 9});
    CHECK(doc["conditions"]["seed"].GetInt() == 7);
    CHECK(std::string(doc["conditions"]["order"].GetString()) == "task by task, every arm in turn");
}

TEST_CASE("through a Pulse gateway over the Responses API: the same scenarios, the same scores") {
    FakeBackend right(kRight);
    Gateway gw("[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"" + right.url() + "\"\n");
    TempDir d;
    auto suite = d.write("suite.json", kSuite);
    AgentRun run({"--arms", "gw=http://127.0.0.1:" + std::to_string(gw.port) + "/v1#m", "--api", "responses", "--suite", suite.string()});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    CHECK(run.doc["arms"][0]["pass"].GetInt() == 3);
    CHECK(std::string(run.doc["conditions"]["api"].GetString()) == "responses");
    // The tool results went back as function_call_output items, which the gateway made tool messages.
    bool tool_message = false;
    for (const auto& q : right.requests()) tool_message = tool_message || q.find(R"("role":"tool")") != std::string::npos;
    CHECK(tool_message);
}

TEST_CASE("against the in-process demo model: the run completes, its random answers fail, and the report says so") {
    TempDir d;
    Gateway gw("[models.demo]\nprofile = \"qwen38\"\n[[models.demo.endpoints]]\nname = \"local\"\nurl = \"decoder://" + (d / "demo.gguf").string() +
               "\"\n[models.demo.endpoints.options]\nmake_demo = true\n[models.demo.profile_options]\nthinking = \"off\"\n");
    const std::string url = "http://127.0.0.1:" + std::to_string(gw.port) + "/v1#demo";
    AgentRun run({"--arms", "demo=" + url, "--api", "responses", "--kind", "repo", "--limit", "2", "--max-turns", "2", "--max-tokens", "24"}, false);
    CAPTURE(run.r.err);
    CHECK(run.r.code == 0);
    CHECK(run.r.out.find("demo: 0 of 2 tasks passed") != std::string::npos);
    std::string json;
    for (const auto& e : fs::directory_iterator(run.out.path()))
        if (e.path().extension() == ".json") json = slurp(e.path());
    rapidjson::Document doc;
    doc.Parse(json.c_str());
    REQUIRE(doc.IsObject());
    CHECK(doc["arms"][0]["pass"].GetInt() == 0);
    CHECK(doc["arms"][0]["error"].GetInt() == 0);  // every request answered: a model result, not a failed run
}

TEST_CASE("parallel calls are matched in any order; wrong calls are named in the detail") {
    const char* two = R"({"tasks":[{"id":"p","user":"Weather in Lisbon and in Madrid?",
      "tools":[{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],
      "expect":[{"tool":"get_weather","args":{"city":{"equals":"Lisbon"}},"result":{"temp_c":21}},
                {"tool":"get_weather","args":{"city":{"equals":"Madrid"}},"result":{"temp_c":25}}],
      "final":[{"contains":"21"},{"contains":"25"}]}]})";
    Script s;
    Result r = run(two, {calls({{"c1", "get_weather", R"({"city":"Madrid"})"}, {"c2", "get_weather", R"({"city":"Lisbon"})"}}),
                         text("Lisbon 21 C, Madrid 25 C")},
                   &s);
    CHECK(r.outcome == "pass");
    CHECK(r.matched == 2);
    CHECK(r.extra_calls == 0);
    // Each call got its own city's result back.
    CHECK(s.seen.at(1).steps.at(0).results.at(0).second == R"({"temp_c":25})");
    CHECK(s.seen.at(1).steps.at(0).results.at(1).second == R"({"temp_c":21})");
    // The same call twice is one match and one extra call, named.
    r = run(two, {calls({{"c1", "get_weather", R"({"city":"Madrid"})"}, {"c2", "get_weather", R"({"city":"Madrid"})"}}), text("25")});
    CHECK(r.outcome == "partial");
    CHECK(r.matched == 1);
    CHECK(r.extra_calls == 1);
    CHECK(r.detail.find(R"(wrong: get_weather({"city":"Madrid"}))") != std::string::npos);
    CHECK(r.detail.find("misses contains \"21\"") != std::string::npos);
}

TEST_CASE("the shipped suite's parallel tasks pass when their calls come in another order") {
    auto tasks = load_suite(slurp(PULSE_SOURCE_ROOT "/tools/bench/data/agent_tasks.json"), "agent_tasks.json");
    int tried = 0;
    for (const auto& t : tasks) {
        if (t.kind != "tools" || t.expect.size() < 2) continue;
        // Two expected calls to the same tool with nothing between them: a parallel batch.
        if (t.expect[0].tool != t.expect[1].tool) continue;
        CAPTURE(t.id);
        // Arguments that satisfy each expected call, from its `equals` checks; reversed order.
        std::vector<Call> cs;
        bool plain = true;
        for (auto it = t.expect.rbegin(); it != t.expect.rend(); ++it) {
            std::string args = "{";
            for (const auto& [name, chk] : it->args) {
                plain = plain && chk.op == "equals";
                args += (args.size() > 1 ? "," : "") + std::string("\"") + name + "\":" + chk.text;
            }
            cs.push_back({"c" + std::to_string(cs.size()), it->tool, args + "}"});
        }
        if (!plain) continue;
        Script s;
        s.replies = {calls(cs)};
        Result r = run_task(t, s.ask(), SandboxLimits{});
        CHECK(r.matched == static_cast<int>(t.expect.size()));
        CHECK(r.extra_calls == 0);
        ++tried;
    }
    CHECK(tried >= 2);  // parallel_weather, weather_two_cities, stock_compare
}

TEST_CASE("every shipped repository task fails when the model leaves the repository untouched") {
    auto tasks = load_suite(slurp(PULSE_SOURCE_ROOT "/tools/bench/data/agent_tasks.json"), "agent_tasks.json");
    int repo = 0;
    for (const auto& t : tasks) {
        if (t.kind != "repo") continue;
        CAPTURE(t.id);
        Script s;
        s.replies = {calls({{"c1", "read_file", R"({"path":"README.md"})"}}), text("I looked; all done.")};
        Result r = run_task(t, s.ask(), SandboxLimits{});
        CHECK(r.outcome == "fail");
        ++repo;
    }
    CHECK(repo >= 8);
}

TEST_CASE("a whole run's table counts every tool-call error, extra calls too; the cap is 8192 and answers cut there are warned about") {
    FakeBackend right(kRight), wrong(kWrong);
    TempDir d;
    auto suite = d.write("suite.json", kSuite);
    AgentRun run({"--arms", "right=" + right.url() + ",wrong=" + wrong.url(), "--suite", suite.string()}, false);
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    std::string wrong_row;
    std::istringstream in(run.r.out);
    for (std::string line; std::getline(in, line);)
        if (line.rfind("wrong ", 0) == 0 && wrong_row.empty()) wrong_row = line;  // the arm table comes first
    CAPTURE(run.r.out);
    CHECK(wrong_row.size() > 0);
    CHECK(std::regex_search(wrong_row, std::regex(R"(\s1\s*$)")));  // get_weather(London), an extra call
    rapidjson::Document q;
    q.Parse(right.requests().at(0).c_str());
    CHECK(q["max_tokens"].GetInt() == 8192);
    CHECK(run.r.out.find("were cut at --max-tokens") == std::string::npos);

    // A cap below what the answers need: every cut answer is counted and the run says so.
    AgentRun low({"--arms", "right=" + right.url(), "--suite", suite.string(), "--max-tokens", "2"}, false);
    CAPTURE(low.r.out);
    CHECK(low.r.out.find("answers of right were cut at --max-tokens 2") != std::string::npos);
}

TEST_CASE("against a Pulse gateway without --api responses: the error says what to pass") {
    FakeBackend right(kRight);
    Gateway gw("[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"" + right.url() + "\"\n");
    TempDir d;
    auto suite = d.write("suite.json", kSuite);
    AgentRun run({"--arms", "gw=http://127.0.0.1:" + std::to_string(gw.port) + "/v1#m", "--suite", suite.string(), "--limit", "1"}, false);
    CHECK(run.r.code == 1);
    CHECK(run.r.err.find("pass --api responses") != std::string::npos);
}

TEST_CASE("hidden repository checks: each passes the task's reference solution and fails the files as given") {
    rapidjson::Document d;
    d.Parse(slurp(PULSE_SOURCE_ROOT "/tools/bench/data/agent_tasks.json").c_str());
    REQUIRE(d.IsObject());
    auto tasks = load_suite(slurp(PULSE_SOURCE_ROOT "/tools/bench/data/agent_tasks.json"), "agent_tasks.json");
    int hidden = 0;
    for (const auto& v : d["tasks"].GetArray()) {
        if (!v.HasMember("reference")) continue;
        const std::string id = v["id"].GetString();
        CAPTURE(id);
        const Task& t = *std::find_if(tasks.begin(), tasks.end(), [&](const Task& x) { return x.id == id; });
        for (const auto& [path, text] : t.files) CHECK(t.check.find(text.substr(0, 40)) == std::string::npos);  // the test is not in the files
        Files f = t.files;
        for (const auto& m : v["reference"].GetObject()) f[m.name.GetString()] = m.value.GetString();
        CHECK(run_shell_sandboxed(t.check, f, SandboxLimits{}).outcome == Outcome::passed);
        Files as_given = t.files;
        CHECK(run_shell_sandboxed(t.check, as_given, SandboxLimits{}).outcome == Outcome::failed);
        ++hidden;
    }
    CHECK(hidden >= 30);
}

TEST_CASE("the suite tells two arms apart: 15 % of tasks answered wrong is detected, two identical arms are not") {
    TempDir d;
    auto oracle = [&](const std::string& name, double fraction) {
        auto path = d / (name + ".json");
        auto r = pulse::test::run({"python3", PULSE_SOURCE_ROOT "/tools/bench/gen_agent_suite.py", "--oracle", path.string(), "--fail-fraction",
                                   std::to_string(fraction)},
                                  {}, 60);
        REQUIRE_MESSAGE(r.code == 0, r.err);
        return slurp(path);
    };
    FakeBackend right(oracle("right", 0)), twin(oracle("right", 0)), degraded(oracle("degraded", 0.15));
    AgentRun run({"--arms", "right=" + right.url() + ",twin=" + twin.url() + ",degraded=" + degraded.url(), "--kind", "tools"});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    const auto& arms = run.doc["arms"];
    CHECK(arms[0]["pass"].GetInt() >= 330);  // every generated task, answered right, passes
    CHECK(arms[0]["by_category"]["parallel"]["pass"].GetInt() == arms[0]["by_category"]["parallel"]["tasks"].GetInt());
    const auto& twin_pair = run.doc["pairs"][0];
    CHECK(std::string(twin_pair["arm"].GetString()) == "twin");
    CHECK(twin_pair["pass_rate_difference"].GetDouble() == 0);
    CHECK(twin_pair["mcnemar_p"].GetDouble() == 1);
    const auto& deg = run.doc["pairs"][1];
    CHECK(std::string(deg["arm"].GetString()) == "degraded");
    CHECK(deg["only_baseline"].GetInt() == 50);  // round(0.15 * 330)
    CHECK(deg["only_arm"].GetInt() == 0);
    CHECK(deg["mcnemar_p"].GetDouble() < 0.05);
    CHECK(deg["ci95"][1].GetDouble() < 0);  // the whole interval below zero
}

TEST_CASE("--kind smoke: one task of each category, fast") {
    TempDir d;
    auto path = d / "o.json";
    REQUIRE(pulse::test::run({"python3", PULSE_SOURCE_ROOT "/tools/bench/gen_agent_suite.py", "--oracle", path.string()}, {}, 60).code == 0);
    FakeBackend right(slurp(path));
    AgentRun run({"--arms", "right=" + right.url(), "--kind", "smoke"});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    CHECK(run.doc["conditions"]["tasks"].GetInt() == 12);
}

TEST_CASE("an arm whose reasoning budget exceeds the output cap is warned about") {
    std::string script = kRight;
    script.insert(1, R"("reasoning_config":true,)");
    FakeBackend right(script);
    Gateway gw("[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"" + right.url() +
               "\"\n[models.m.policy]\nname = \"static\"\n[models.m.policy.options]\nbudgets = { medium = 4096 }\n");
    TempDir d;
    auto suite = d.write("suite.json", kSuite);
    const std::string arm = "gw=http://127.0.0.1:" + std::to_string(gw.port) + "/v1#m";
    AgentRun low({"--arms", arm, "--api", "responses", "--effort", "medium", "--suite", suite.string(), "--max-tokens", "1024"}, false);
    CAPTURE(low.r.out);
    CHECK(low.r.out.find("gw's reasoning budget (4096, X-Pulse-Reasoning-Budget) exceeds --max-tokens 1024") != std::string::npos);
    AgentRun ok({"--arms", arm, "--api", "responses", "--effort", "medium", "--suite", suite.string()}, false);
    CHECK(ok.r.out.find("exceeds --max-tokens") == std::string::npos);
}
