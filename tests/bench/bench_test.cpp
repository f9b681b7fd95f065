// `pulse bench`: the estimators with known inputs, the sandbox against hostile programs, and
// every tool end to end against the fake backend (deterministic token counts, scripted answers,
// simulated MTP counters and prefix cache).
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <Poco/DeflatingStream.h>
#include <rapidjson/document.h>

#include "pulse-bench/client.h"
#include "pulse-bench/humaneval.h"
#include "pulse-bench/prometheus.h"
#include "pulse-bench/sandbox.h"
#include "pulse-bench/stats.h"
#include "support/gateway_harness.h"

using namespace pulse::bench;
using namespace pulse::test;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Runs `pulse bench ...` with --json into a temp dir; returns the exit code and the JSON.
struct BenchRun {
    TempDir out;
    Result r;
    rapidjson::Document doc;
    BenchRun(std::vector<std::string> args, double timeout_s = 120) {
        std::vector<std::string> argv = {env_or_fail("PULSE_EXE"), "bench"};
        argv.insert(argv.end(), args.begin(), args.end());
        argv.insert(argv.end(), {"--json", "--out", out.path().string()});
        r = run(argv, {}, timeout_s);
        doc.Parse(r.out.c_str());
    }
    std::vector<fs::path> files(const std::string& ext) const {
        std::vector<fs::path> v;
        for (const auto& e : fs::directory_iterator(out.path()))
            if (e.path().extension() == ext) v.push_back(e.path());
        return v;
    }
};

const char* kProblems[] = {
    R"({"task_id": "Mini/0", "prompt": "def add(a: int, b: int) -> int:\n    \"\"\"Return a + b.\"\"\"\n", "entry_point": "add", "canonical_solution": "    return a + b\n", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-4, 4) == 0\n"})",
    R"({"task_id": "Mini/1", "prompt": "def is_palindrome(s: str) -> bool:\n    \"\"\"True when s reads the same backwards.\"\"\"\n", "entry_point": "is_palindrome", "canonical_solution": "    return s == s[::-1]\n", "test": "def check(candidate):\n    assert candidate('abba')\n    assert not candidate('abc')\n"})",
    R"({"task_id": "Mini/2", "prompt": "def count_up(n: int) -> list:\n    \"\"\"Return [0, 1, ..., n-1].\"\"\"\n", "entry_point": "count_up", "canonical_solution": "    return list(range(n))\n", "test": "def check(candidate):\n    assert candidate(3) == [0, 1, 2]\n"})",
};

fs::path write_problems(const TempDir& d, const std::string& name) {
    std::string text;
    for (const char* p : kProblems) text += std::string(p) + "\n";
    return d.write(name, text);
}

int open_listener(uint16_t& port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd, 8);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    return fd;
}

}  // namespace

// ---- estimators ------------------------------------------------------------------------------

TEST_CASE("summarize: mean, median, sample stdev, range, and a robust outlier flag") {
    Summary s = summarize({10, 11, 9, 10, 30});
    CHECK(s.n == 5);
    CHECK(s.mean == doctest::Approx(14));
    CHECK(s.median == doctest::Approx(10));
    CHECK(s.stdev == doctest::Approx(8.9722).epsilon(1e-4));  // sqrt(322 / 4)
    CHECK(s.min == 9);
    CHECK(s.max == 30);
    CHECK(s.outliers == std::vector<size_t>{4});
    CHECK(summarize({5, 5, 5}).outliers.empty());
    CHECK(summarize({}).n == 0);
}

TEST_CASE("pass@k: HumanEval's unbiased estimator") {
    CHECK(pass_at_k(5, 2, 1) == doctest::Approx(0.4));
    CHECK(pass_at_k(5, 2, 2) == doctest::Approx(0.7));  // 1 - C(3,2)/C(5,2)
    CHECK(pass_at_k(10, 0, 5) == doctest::Approx(0.0));
    CHECK(pass_at_k(10, 8, 5) == doctest::Approx(1.0));  // n - c < k
    CHECK(pass_at_k(1, 1, 1) == doctest::Approx(1.0));
    CHECK(pass_at_k(3, 1, 4) == -1);
}

TEST_CASE("decode tok/s: output tokens after the first over the time after the first") {
    StreamResult r;
    r.ttft = 0.5;
    r.last_token = 2.5;
    r.completion_tokens = 101;
    CHECK(r.decode_tps() == doctest::Approx(50));
    r.completion_tokens = 1;
    CHECK(r.decode_tps() == 0);
}

TEST_CASE("prometheus: spec counters summed over label sets, per position, both engines") {
    auto c = parse_spec_counters(
        "# HELP x\nvllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 10.0\n"
        "vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"m\"} 5.0\n"
        "vllm:spec_decode_num_draft_tokens_total{engine=\"0\"} 45\n"
        "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\"} 20\n"
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"0\"} 12\n"
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"2\"} 3\n"
        "vllm:num_requests_running 1\n");
    CHECK(c.found);
    CHECK(c.prefix == "vllm:");
    CHECK(c.drafts == 15);
    CHECK(c.draft_tokens == 45);
    CHECK(c.accepted == 20);
    CHECK(c.per_pos.at(0) == 12);
    CHECK(c.per_pos.at(2) == 3);
    auto l = parse_spec_counters("llamacpp:spec_decode_num_drafts_total 7\n");
    CHECK(l.prefix == "llamacpp:");
    CHECK(l.drafts == 7);
    CHECK_FALSE(parse_spec_counters("process_cpu_seconds_total 3\n").found);
}

// ---- HumanEval plumbing ----------------------------------------------------------------------

TEST_CASE("humaneval: problems load from .jsonl and .jsonl.gz; a bad line names itself") {
    TempDir d;
    auto plain = write_problems(d, "mini.jsonl");
    CHECK(load_problems(plain).size() == 3);
    {
        std::ofstream gz(d / "mini.jsonl.gz", std::ios::binary);
        Poco::DeflatingOutputStream z(gz, Poco::DeflatingStreamBuf::STREAM_GZIP);
        z << slurp(plain);
        z.close();
    }
    auto gzp = load_problems(d / "mini.jsonl.gz");
    REQUIRE(gzp.size() == 3);
    CHECK(gzp[1].entry_point == "is_palindrome");
    d.write("bad.jsonl", std::string(kProblems[0]) + "\n{\"task_id\": 3}\n");
    CHECK_THROWS_WITH_AS(load_problems(d / "bad.jsonl"), doctest::Contains("bad.jsonl:2: expected a JSON object with string 'task_id'"),
                         std::runtime_error);
}

TEST_CASE("humaneval: the code in a chat answer becomes the completion, then the program") {
    TempDir d;
    auto p = load_problems(write_problems(d, "m.jsonl"))[0];
    std::string answer = "<think>easy</think>Here you go:\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```\nDone.";
    std::string c = completion_from_chat(p, answer);
    CHECK(c == "\ndef add(a: int, b: int) -> int:\n    return a + b\n");
    std::string prog = program_for(p, c);
    CHECK(prog.rfind(p.prompt, 0) == 0);
    CHECK(prog.find("check(add)") != std::string::npos);
    CHECK(completion_from_chat(p, "```\n    return a + b\n```") == "    return a + b\n");  // a body continues the prompt
    CHECK(completion_from_raw("    return a + b\n\ndef unrelated():\n    pass\n") == "    return a + b\n");
}

// ---- the sandbox (each hostile behaviour is a test) --------------------------------------------

TEST_CASE("sandbox: a correct program passes, a wrong one fails, a crash is a crash") {
    SandboxLimits l;
    CHECK(run_python_sandboxed("print('ok')\n", l).outcome == Outcome::passed);
    auto f = run_python_sandboxed("assert 1 == 2\n", l);
    CHECK(f.outcome == Outcome::failed);
    CHECK(f.output.find("AssertionError") != std::string::npos);
    auto c = run_python_sandboxed("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", l);
    CHECK(c.outcome == Outcome::crashed);
    CHECK(c.signal == SIGSEGV);
}

// A quick command's status must not be lost to a race between the sandbox's two reporters: its
// PID 1 reports how the command ended, its outer child reports PID 1's pid, and either may write
// first. Concurrent runs make the interleavings that a loaded CI machine makes now and then.
TEST_CASE("sandbox: a command that ends at once still reports its status, under concurrency") {
    std::atomic<int> runs{0}, lost{0};
    std::string first_problem;
    std::mutex mu;
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t)
        threads.emplace_back([&] {
            for (int i = 0; i < 20; ++i) {
                Files files;
                auto r = run_shell_sandboxed(i % 2 ? "exit 3" : "exit 0", files, SandboxLimits{});
                ++runs;
                if (r.outcome != (i % 2 ? Outcome::failed : Outcome::passed)) {
                    ++lost;
                    std::lock_guard lock(mu);
                    if (first_problem.empty()) first_problem = std::string(outcome_name(r.outcome)) + ": " + r.detail;
                }
            }
        });
    for (auto& t : threads) t.join();
    CHECK(runs == 120);
    CHECK_MESSAGE(lost == 0, first_problem);
}

TEST_CASE("sandbox: no network, not even the host's loopback") {
    uint16_t port = 0;
    int fd = open_listener(port);
    auto r = run_python_sandboxed("import socket\ntry:\n    socket.create_connection(('127.0.0.1', " + std::to_string(port) +
                                      "), timeout=2)\n    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e)\n",
                                  SandboxLimits{});
    CHECK(r.outcome == Outcome::passed);
    CHECK(r.output.find("blocked") != std::string::npos);
    CHECK(r.output.find("CONNECTED") == std::string::npos);
    pollfd p{fd, POLLIN, 0};
    CHECK(::poll(&p, 1, 200) == 0);  // nobody knocked
    ::close(fd);
}

TEST_CASE("sandbox: writes outside its directory fail; the host is untouched") {
    TempDir host;
    auto target = host / "escape.txt";
    std::string prog = "import os\nok = []\nfor p in ['" + target.string() + "', '/etc/pulse-escape', '/usr/pulse-escape', '/tmp/pulse-escape', '/pulse-escape']:\n"
                       "    try:\n        open(p, 'w').write('x')\n        ok.append(p)\n    except OSError:\n        pass\n"
                       "open('inside.txt', 'w').write('fine')\nprint('escaped:', ok)\nassert not ok\n";
    auto r = run_python_sandboxed(prog, SandboxLimits{});
    CHECK_MESSAGE(r.outcome == Outcome::passed, r.output);
    CHECK_FALSE(fs::exists(target));
    CHECK_FALSE(fs::exists("/etc/pulse-escape"));
    CHECK_FALSE(fs::exists("/tmp/pulse-escape"));
}

TEST_CASE("sandbox: an infinite loop is stopped by the CPU limit and recorded as a timeout") {
    SandboxLimits l;
    l.cpu_s = 1;
    l.wall_s = 20;
    auto r = run_python_sandboxed("while True:\n    pass\n", l);
    CHECK(r.outcome == Outcome::timeout);
    CHECK(r.wall_s < 10);
}

TEST_CASE("sandbox: a fork bomb hits the process limit and the wall timeout; nothing survives") {
    SandboxLimits l;
    l.wall_s = 3;
    auto r = run_python_sandboxed("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", l);
    CHECK(r.outcome == Outcome::timeout);
    CHECK(r.wall_s < 8);
    ::usleep(300000);
    // No process of the sandbox is left: none runs prog.py any more.
    int left = 0;
    for (const auto& e : fs::directory_iterator("/proc")) {
        std::string cmd = slurp(e.path() / "cmdline");
        if (cmd.find("prog.py") != std::string::npos) ++left;
    }
    CHECK(left == 0);
}

// ---- tools end to end against the fake backend -------------------------------------------------

TEST_CASE("bench decode: two arms interleaved, usage token counts, pair ratios, JSON with conditions and a chart") {
    FakeBackend a(R"({"turns":[{"content":"a b c d e f g h i j","delay_ms":2,"usage":{"prompt_tokens":50,"completion_tokens":10}}]})");
    FakeBackend b(R"({"turns":[{"content":"a b c d e f g h i j","delay_ms":1,"usage":{"prompt_tokens":50,"completion_tokens":10}}]})");
    BenchRun run({"decode", "--arms", "base=" + a.url(), "--arms", "fast=" + b.url(), "--interleave", "--reps", "2"});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    auto& d = run.doc;
    REQUIRE(d.IsObject());
    const auto& runs = d["runs"];
    REQUIRE(runs.Size() == 2 * 4 * 2);  // arms x prompts x reps
    for (rapidjson::SizeType i = 0; i < runs.Size(); ++i) {
        CHECK(std::string(runs[i]["arm"].GetString()) == (i % 2 ? "fast" : "base"));  // A B A B
        CHECK(runs[i]["completion_tokens"].GetInt() == 10);
        CHECK(runs[i]["ok"].GetBool());
        CHECK(runs[i]["decode_tps"].GetDouble() > 0);
    }
    const auto& c = d["conditions"];
    CHECK(c["endpoints"].Size() == 2);
    CHECK(std::string(c["endpoints"][0]["backend"]["version"].GetString()) == "0.0.0-fake");
    CHECK(std::string(c["endpoints"][0]["model"].GetString()) == "fake");
    CHECK(c["sampler"]["temperature"].GetDouble() == 0);
    CHECK(c["sampler"]["max_tokens"].GetInt() == 600);
    CHECK(c["chat_template_kwargs"]["enable_thinking"].IsFalse());
    CHECK(std::string(c["pulse_revision"].GetString()).size() > 0);
    CHECK(d["summary"].Size() == 4);  // 2 arms x 2 kinds
    CHECK(d["pairs"][0]["decode_tps_ratio"]["n"].GetInt() == 8);
    // What the backend saw: temperature 0, thinking off, usage requested.
    auto reqs = a.requests();
    REQUIRE(reqs.size() == 8);
    rapidjson::Document q;
    q.Parse(reqs[0].c_str());
    CHECK(q["temperature"].GetDouble() == 0);
    CHECK(q["stream_options"]["include_usage"].IsTrue());
    CHECK(q["chat_template_kwargs"]["enable_thinking"].IsFalse());
    CHECK(run.files(".json").size() == 1);
    REQUIRE(run.files(".svg").size() == 1);
    CHECK(slurp(run.files(".svg")[0]).find("<svg") != std::string::npos);
}

TEST_CASE("bench decode --api responses: two policies on one gateway compared on the same prompts (tokens, time)") {
    // One backend that enforces reasoning budgets; two models on it whose policies differ.
    FakeBackend be(R"({"reasoning_config":true,"turns":[{"reasoning":"a b c d e f g h i j","content":"ok done","delay_ms":1}]})");
    std::string models;
    for (auto [name, budget] : {std::pair{"tight", 2}, std::pair{"loose", 8}})
        models += std::string("[models.") + name + "]\nprofile = \"qwen38\"\n[[models." + name + ".endpoints]]\nurl = \"" + be.url() +
                  "\"\n[models." + name + ".policy]\nname = \"static\"\n[models." + name + ".policy.options]\nbudgets = { medium = " +
                  std::to_string(budget) + " }\n";
    Gateway gw(models);
    const std::string url = "http://127.0.0.1:" + std::to_string(gw.port) + "/v1";
    BenchRun run({"decode", "--api", "responses", "--effort", "medium", "--arms", "tight=" + url + "#tight,loose=" + url + "#loose", "--interleave",
                  "--reps", "1", "--max-tokens", "64"});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    auto& d = run.doc;
    CHECK(std::string(d["conditions"]["api"].GetString()) == "responses");
    CHECK(std::string(d["conditions"]["effort"].GetString()) == "medium");
    const auto& runs = d["runs"];
    REQUIRE(runs.Size() == 2 * 4);
    for (rapidjson::SizeType i = 0; i < runs.Size(); ++i) {
        bool tight = std::string(runs[i]["arm"].GetString()) == "tight";
        CHECK(runs[i]["reasoning_tokens"].GetInt() == (tight ? 2 : 8));
        CHECK(runs[i]["completion_tokens"].GetInt() == (tight ? 4 : 10));
    }
    const auto& pair = d["pairs"][0];
    CHECK(std::string(pair["arm"].GetString()) == "loose");
    CHECK(pair["output_tokens_ratio"]["median"].GetDouble() == doctest::Approx(2.5));
    CHECK(pair["e2e_ratio"]["n"].GetInt() == 4);
    // The gateway saw each arm's model, with the effort asked for.
    auto reqs = be.requests();
    REQUIRE(reqs.size() == 8);
    int tight = 0;
    for (const auto& q : reqs) tight += q.find("\"thinking_token_budget\":2") != std::string::npos;
    CHECK(tight == 4);
}

TEST_CASE("bench accept: acceptance rate, tokens per step and per position from /metrics deltas") {
    FakeBackend be(R"({"turns":[{"content":"x y z"}],"spec":{"drafts_per_request":10,"accept":[0.8,0.6,0.4]}})");
    // Traffic before the run must not count: deltas only.
    BenchRun warm({"decode", "--endpoint", be.url(), "--reps", "1", "--no-plot"});
    BenchRun run({"accept", "--endpoint", be.url()});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    const auto& acc = run.doc["acceptance"];
    CHECK(acc["drafts"].GetDouble() == 400);        // 40 prompts x 10
    CHECK(acc["draft_tokens"].GetDouble() == 1200);  // x K = 3
    CHECK(acc["accepted_tokens"].GetDouble() == 720);
    CHECK(acc["acceptance_rate"].GetDouble() == doctest::Approx(0.6));
    CHECK(acc["mean_tokens_per_step"].GetDouble() == doctest::Approx(2.8));
    REQUIRE(acc["per_position"].Size() == 3);
    CHECK(acc["per_position"][0]["rate"].GetDouble() == doctest::Approx(0.8));
    CHECK(acc["per_position"][2]["rate"].GetDouble() == doctest::Approx(0.4));
    CHECK(run.doc["runs"].Size() == 40);
}

TEST_CASE("bench accept: llama-server timings when there are no metrics") {
    FakeBackend be(R"({"turns":[{"content":"x y z"}],"spec":{"drafts_per_request":4,"accept":[0.5,0.25]}})", "llamacpp");
    TempDir d;
    auto prompts = d.write("p.json", R"({"prompts":[{"id":"one","user":"hi"},{"id":"two","user":"there"}]})");
    BenchRun run({"accept", "--endpoint", be.url(), "--prompts", prompts.string(), "--metrics", be.url() + "/nothing-here"});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    const auto& acc = run.doc["acceptance"];
    CHECK(std::string(acc["source"].GetString()).find("timings") != std::string::npos);
    CHECK(acc["draft_tokens"].GetInt() == 16);  // 2 prompts x 4 drafts x 2
    CHECK(acc["accepted_tokens"].GetInt() == 6);  // 2 x (2 + 1)
}

TEST_CASE("bench quality: a 3-problem subset with right, wrong and looping answers scores exactly") {
    FakeBackend be(R"({"turns":[
        {"match":"def add(", "content":"```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"},
        {"match":"def is_palindrome(", "content":"```python\ndef is_palindrome(s: str) -> bool:\n    return True\n```"},
        {"match":"def count_up(", "content":"```python\ndef count_up(n: int) -> list:\n    while True:\n        pass\n```"},
        {"content":"no idea"}]})");
    TempDir d;
    auto ds = write_problems(d, "mini.jsonl");
    BenchRun run({"quality", "--endpoint", be.url(), "--dataset", ds.string(), "--exec-timeout", "10", "--cpu-s", "1"}, 180);
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    CHECK(run.doc["pass_at_k"]["pass@1"].GetDouble() == doctest::Approx(1.0 / 3));
    const auto& o = run.doc["outcomes"];
    CHECK(o["passed"].GetInt() == 1);
    CHECK(o["failed"].GetInt() == 1);
    CHECK(o["timeout"].GetInt() == 1);
    CHECK(o["crashed"].GetInt() == 0);
    CHECK(o["error"].GetInt() == 0);
    CHECK(std::string(run.doc["problems"][2]["samples"][0]["outcome"].GetString()) == "timeout");
    std::string samples = slurp(run.doc["samples_file"].GetString());
    CHECK(std::count(samples.begin(), samples.end(), '\n') == 3);
    CHECK(samples.find("\"task_id\":\"Mini/0\"") != std::string::npos);
}

TEST_CASE("bench quality: two arms (two models of one gateway) on the same problems, interleaved, scored each") {
    FakeBackend good(R"({"turns":[
        {"match":"def add(", "content":"```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"},
        {"match":"def is_palindrome(", "content":"```python\ndef is_palindrome(s: str) -> bool:\n    return s == s[::-1]\n```"},
        {"match":"def count_up(", "content":"```python\ndef count_up(n: int) -> list:\n    return list(range(n))\n```"},
        {"content":"no idea"}]})");
    FakeBackend bad(R"({"turns":[{"content":"```python\ndef add(a, b):\n    return None\ndef is_palindrome(s):\n    return None\ndef count_up(n):\n    return None\n```"}]})");
    Gateway gw("[models.good]\nprofile = \"qwen38\"\n[[models.good.endpoints]]\nurl = \"" + good.url() + "\"\n[models.bad]\nprofile = \"qwen38\"\n" +
               "[[models.bad.endpoints]]\nurl = \"" + bad.url() + "\"\n");
    const std::string url = "http://127.0.0.1:" + std::to_string(gw.port) + "/v1";
    TempDir d;
    auto ds = write_problems(d, "mini.jsonl");
    BenchRun run({"quality", "--api", "responses", "--arms", "good=" + url + "#good,bad=" + url + "#bad", "--dataset", ds.string(),
                  "--exec-timeout", "10", "--cpu-s", "1"},
                 180);
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    const auto& arms = run.doc["arms"];
    REQUIRE(arms.Size() == 2);
    CHECK(std::string(arms[0]["arm"].GetString()) == "good");
    CHECK(arms[0]["pass_at_k"]["pass@1"].GetDouble() == doctest::Approx(1.0));
    CHECK(arms[0]["outcomes"]["passed"].GetInt() == 3);
    CHECK(arms[1]["pass_at_k"]["pass@1"].GetDouble() == doctest::Approx(0.0));
    CHECK(arms[1]["outcomes"]["failed"].GetInt() == 3);
    CHECK(arms[0]["output_tokens"]["n"].GetInt() == 3);
    CHECK(std::string(run.doc["conditions"]["api"].GetString()) == "responses");
    std::string samples = slurp(run.doc["samples_file"].GetString());
    CHECK(std::count(samples.begin(), samples.end(), '\n') == 6);
    CHECK(samples.find("\"arm\":\"bad\",\"task_id\":\"Mini/0\"") != std::string::npos);
    CHECK(good.requests().size() == 3);
    CHECK(bad.requests().size() == 3);
}

TEST_CASE("bench quality: pass@k with several samples, and a dataset that is missing is a usage error") {
    FakeBackend be(R"({"turns":[{"content":"```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"}]})");
    TempDir d;
    auto ds = d.write("one.jsonl", std::string(kProblems[0]) + "\n" + kProblems[1] + "\n");
    BenchRun run({"quality", "--endpoint", be.url(), "--dataset", ds.string(), "--samples", "2", "--k", "1,2"}, 180);
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    // Mini/0: 2 of 2 pass; Mini/1: the answer defines add, not is_palindrome: 0 of 2.
    CHECK(run.doc["pass_at_k"]["pass@1"].GetDouble() == doctest::Approx(0.5));
    CHECK(run.doc["pass_at_k"]["pass@2"].GetDouble() == doctest::Approx(0.5));
    // The samples file and the results share the run's name (and no other run has it).
    auto results = run.files(".json");
    REQUIRE(results.size() == 1);
    CHECK(std::string(run.doc["samples_file"].GetString()) == (run.out / (results[0].stem().string() + "-samples.jsonl")).string());
    BenchRun missing({"quality", "--endpoint", be.url()});
    CHECK(missing.r.code == 2);
    CHECK(missing.r.err.find("--dataset") != std::string::npos);
    BenchRun badk({"quality", "--endpoint", be.url(), "--dataset", ds.string(), "--k", "5"});
    CHECK(badk.r.code == 2);
}

TEST_CASE("bench drift: identical fraction, first divergence and speed ratio") {
    TempDir d;
    auto prompts = d.write("p.json", R"({"prompts":[{"id":"same","user":"alpha"},{"id":"differs","user":"beta"}]})");
    FakeBackend a(R"({"turns":[{"match":"alpha","content":"one two three"},{"match":"beta","content":"red green blue"}]})");
    FakeBackend b(R"({"turns":[{"match":"alpha","content":"one two three"},{"match":"beta","content":"red grey blue"}]})");
    BenchRun run({"drift", "--arms", "a=" + a.url() + ",b=" + b.url(), "--prompts", prompts.string()});
    REQUIRE_MESSAGE(run.r.code == 0, run.r.err);
    const auto& s = run.doc["summary"];
    CHECK(s["compared"].GetInt() == 2);
    CHECK(s["identical"].GetInt() == 1);
    CHECK(s["identical_fraction"].GetDouble() == doctest::Approx(0.5));
    const auto& p = run.doc["prompts"];
    CHECK(p[0]["identical"].IsTrue());
    CHECK(p[1]["identical"].IsFalse());
    CHECK(p[1]["first_divergence_char"].GetInt() == 7);  // "red gre" then 'e' vs 'y'
    CHECK(p[1]["first_divergence_word"].GetInt() == 2);
    BenchRun one({"drift", "--endpoint", a.url()});
    CHECK(one.r.code == 2);
}

TEST_CASE("bench ttft: cold vs warm prefix cache, and the first turn after a backend restart") {
    TempDir d;
    auto script = d.write("s.json", R"({"turns":[{"content":"tokens"}],"prefix_cache":true})");
    uint16_t port = 0;
    { int fd = open_listener(port); ::close(fd); }
    // The backend runs under a tiny supervisor script so --restart-cmd can restart it.
    auto start = d.write("start.sh", "#!/bin/bash\ncd '" + d.path().string() + "'\nsetsid '" + env_or_fail("PULSE_FAKE_VLLM") +
                                         "' --script s.json --port " + std::to_string(port) + " > fake.log 2>&1 < /dev/null &\necho $! > fake.pid\n"
                                         "for i in $(seq 1 100); do grep -q listening fake.log && exit 0; sleep 0.05; done; exit 1\n");
    // A restart waits for the old process to exit, as a service manager does: the fake listens
    // with SO_REUSEPORT (POCO's default), so a new one started beside a dying one shared the port
    // with it, and the dying one could take the first request and close it unanswered (a CI run:
    // "No message received").
    auto restart = d.write("restart.sh", "#!/bin/bash\ncd '" + d.path().string() +
                                             "'\npid=$(cat fake.pid); kill $pid\n"
                                             "for i in $(seq 1 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done\n./start.sh\n");
    fs::permissions(start, fs::perms(0755));
    fs::permissions(restart, fs::perms(0755));
    REQUIRE(run({start.string()}).code == 0);
    std::string url = "http://127.0.0.1:" + std::to_string(port) + "/v1";
    BenchRun r({"ttft", "--endpoint", url, "--cases", "cold,warm,restart", "--restart-cmd", restart.string(), "--reps", "2",
                "--prompt-words", "400", "--no-plot"});
    run({"bash", "-c", "kill $(cat '" + (d / "fake.pid").string() + "')"});
    // Exit 1 with nothing on stderr is a failed request: its error is in the JSON runs.
    REQUIRE_MESSAGE(r.r.code == 0, r.r.err << r.r.out.substr(0, 4000) << "\nfake.log: " << run({"cat", (d / "fake.log").string()}).out);
    std::map<std::string, double> cached;
    for (const auto& s : r.doc["summary"].GetArray()) cached[s["case"].GetString()] = s["cached_tokens"]["median"].GetDouble();
    CHECK(cached["warm"] > 400);            // the whole shared context came from the cache
    CHECK(cached["cold"] < cached["warm"] / 10);
    CHECK(cached["restart"] < cached["warm"] / 10);  // a restarted backend starts cold
    CHECK(r.doc["runs"].Size() == 5);       // 2 cold + 2 warm + 1 restart
}

// A fake backend on a fixed port behind start/restart scripts, so --restart-cmd can restart it.
struct RestartableBackend {
    TempDir d;
    uint16_t port = 0;
    fs::path restart;
    explicit RestartableBackend(double down_s) {
        d.write("s.json", R"({"turns":[{"content":"tokens"}],"prefix_cache":true})");
        { int fd = open_listener(port); ::close(fd); }
        auto start = d.write("start.sh", "#!/bin/bash\ncd '" + d.path().string() + "'\n: > fake.log\nsetsid '" + env_or_fail("PULSE_FAKE_VLLM") +
                                             "' --script s.json --port " + std::to_string(port) + " > fake.log 2>&1 < /dev/null &\necho $! > fake.pid\n"
                                             "for i in $(seq 1 100); do grep -q listening fake.log && exit 0; sleep 0.05; done; exit 1\n");
        restart = d.write("restart.sh", "#!/bin/bash\ncd '" + d.path().string() + "'\nkill $(cat fake.pid); sleep " + std::to_string(down_s) + "\n./start.sh\n");
        fs::permissions(start, fs::perms(0755));
        fs::permissions(restart, fs::perms(0755));
        REQUIRE(run({start.string()}).code == 0);
    }
    ~RestartableBackend() { run({"bash", "-c", "kill $(cat '" + (d / "fake.pid").string() + "')"}); }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port) + "/v1"; }
};

TEST_CASE("bench ttft through the gateway: after a backend restart, warmup refills the prefix cache (on vs off)") {
    for (bool warmup : {true, false}) {
        CAPTURE(warmup);
        RestartableBackend be(1.0);  // down long enough for the gateway's probes to notice
        Gateway gw("[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nname = \"node\"\nurl = \"" + be.url() + "\"\n", "",
                   Gateway::kUpstream, std::string("[warmup]\nenabled = ") + (warmup ? "true" : "false") + "\n");
        BenchRun r({"ttft", "--endpoint", "http://127.0.0.1:" + std::to_string(gw.port) + "/v1", "--api", "responses", "--model", "m",
                    "--cases", "restart", "--restart-cmd", be.restart.string(), "--prompt-words", "400", "--no-plot"});
        REQUIRE_MESSAGE(r.r.code == 0, r.r.err << gw.log());
        double cached = r.doc["summary"][0]["cached_tokens"]["median"].GetDouble();
        double warmups = r.doc["gateway_warmup_requests"].GetDouble();
        if (warmup) {
            CHECK(warmups >= 1);
            CHECK(cached > 400);  // the warm request refilled the restarted backend's cache
        } else {
            CHECK(warmups == 0);
            CHECK(cached < 50);
        }
    }
}

TEST_CASE("bench: usage errors exit 2 with the reason") {
    for (auto args : std::vector<std::vector<std::string>>{
             {"decode"}, {"nonsense", "--endpoint", "http://127.0.0.1:9/v1"}, {"decode", "--endpoint", "ftp://x"},
             {"decode", "--endpoint", "http://127.0.0.1:9/v1", "--reps", "0"}, {"ttft", "--endpoint", "http://127.0.0.1:9/v1", "--cases", "restart"}}) {
        BenchRun r(args);
        CHECK_MESSAGE(r.r.code == 2, args[0]);
        CHECK(r.r.err.find("pulse bench") == 0);  // the command, then what is wrong
        CHECK(r.r.err.find("`pulse bench") != std::string::npos);
    }
    BenchRun down({"decode", "--endpoint", "http://127.0.0.1:9/v1"});  // nothing listens
    CHECK(down.r.code == 1);
}
