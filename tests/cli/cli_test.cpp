// The `pulse` binary as a user runs it: help, exit codes, config check, plugins, model, serve.
#include <doctest/doctest.h>

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <rapidjson/document.h>
#include <signal.h>

#include <cstdlib>
#include <regex>
#include <sstream>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using pulse::test::run;
using pulse::test::TempDir;

namespace {

std::string exe() {
    const char* e = std::getenv("PULSE_EXE");
    REQUIRE_MESSAGE(e, "PULSE_EXE must point at the pulse binary");
    return e;
}
fs::path built(const std::string& name) { return fs::path(std::getenv("PULSE_TEST_PLUGIN_DIR")) / (name + ".so"); }
bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// A config in a temp dir whose plugin dir holds copies of the named test plugins.
struct Site {
    TempDir tmp;
    fs::path config;
    Site(std::initializer_list<std::string> plugins, const std::string& extra_toml) {
        fs::create_directories(tmp / "plugins");
        for (const auto& p : plugins) {
            fs::copy_file(built(p), tmp / "plugins" / (p + ".so"));
            fs::permissions(tmp / "plugins" / (p + ".so"), fs::perms(0755));
        }
        config = tmp.write("pulse.toml", "[plugins]\ndirs = [\"plugins\"]\ndropin_dirs = []\n" + extra_toml);
    }
};

const std::map<std::string, std::string> kNoEnvOverrides = {
    {"PULSE_PLUGIN_DIRS", ""}, {"PULSE_QWEN_BACKENDS", ""}, {"PULSE_CONFIG", ""}, {"PULSE_GATEWAY_API_KEY", ""}};

}  // namespace

TEST_CASE("version and help") {
    auto r = run({exe(), "version"});
    CHECK(r.code == 0);
    CHECK(std::regex_search(r.out, std::regex(R"(^pulse \d+\.\d+\.\d+ \(plugin ABI 1\.4\)\n$)")));

    r = run({exe(), "--help"});
    CHECK(r.code == 0);
    for (const char* c : {"serve", "plugins", "config check", "model", "version", "exit codes"}) CHECK(has(r.out, c));
    CHECK(run({exe(), "--version"}).out == run({exe(), "version"}).out);
    for (const char* c : {"serve", "plugins", "config", "model"}) {
        auto h = run({exe(), c, "--help"});
        CAPTURE(c);
        CHECK(h.code == 0);
        CHECK(has(h.out, std::string("usage: pulse ") + c));
    }
}

TEST_CASE("usage errors exit 2") {
    auto r = run({exe()});
    CHECK(r.code == 2);
    r = run({exe(), "frobnicate"});
    CHECK(r.code == 2);
    CHECK(has(r.err, "not expected: frobnicate"));
    r = run({exe(), "serve", "--bogus"});
    CHECK(r.code == 2);
    CHECK(has(r.err, "pulse serve: The following argument was not expected: --bogus"));
    CHECK(has(r.err, "`pulse serve --help` shows the usage"));
    r = run({exe(), "config"});
    CHECK(r.code == 2);
    r = run({exe(), "serve", "--config"});
    CHECK(r.code == 2);
    CHECK(has(r.err, "--config: 1 required"));
    r = run({exe(), "serve", "--log-level", "loud"});
    CHECK(r.code == 2);
    CHECK(has(r.err, "--log-level: loud not in {trace,debug,info,warn,error,off}"));
}

TEST_CASE("config check: valid file, invalid file, missing file") {
    auto r = run({exe(), "config", "check", PULSE_SOURCE_ROOT "/config/pulse.toml"}, kNoEnvOverrides);
    CHECK(r.code == 0);
    CHECK(has(r.out, "ok (1 model, listen 127.0.0.1:8800)"));

    TempDir tmp;
    auto bad = tmp.write("bad.toml", "[server]\nlisten = \"127.0.0.1:8800\"\nthreads = 4\n");
    r = run({exe(), "config", "check", bad.string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, bad.string() + ":3:1: unknown key 'server.threads'"));

    r = run({exe(), "config", "check", (tmp / "nope.toml").string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, "cannot read the config file"));

    // Environment overrides are validated too.
    auto env = kNoEnvOverrides;
    env["PULSE_QWEN_BACKENDS"] = "garbage";
    r = run({exe(), "config", "check", PULSE_SOURCE_ROOT "/config/pulse.toml"}, env);
    CHECK(r.code == 3);
    CHECK(has(r.err, "PULSE_QWEN_BACKENDS"));
}

// config check validates what serve validates before it listens: the profile a model names and
// that profile's options (they used to pass the check and make serve exit).
TEST_CASE("config check: a misspelt profile, profile option or key is named with the closest known one") {
    TempDir tmp;
    const std::string endpoint = "[[models.m.endpoints]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/v1\"\n";
    auto profile = tmp.write("profile.toml", "[models.m]\nprofile = \"qwen83\"\n" + endpoint);
    auto r = run({exe(), "config", "check", profile.string()}, kNoEnvOverrides);
    CHECK(r.code == 4);
    CHECK(has(r.err, "model 'm': translation profile 'qwen83' (did you mean 'qwen38'?) is not provided by any loaded plugin"));
    CHECK(!has(r.out, "ok"));
    auto option = tmp.write("option.toml", "[models.m]\nprofile = \"qwen38\"\n[models.m.profile_options]\nthinkng = true\n" + endpoint);
    r = run({exe(), "config", "check", option.string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, "models.m.profile_options: qwen38: unknown profile option 'thinkng' (did you mean 'thinking'?)"));
    auto value = tmp.write("value.toml", "[models.m]\nprofile = \"llamacpp\"\n[models.m.profile_options]\nresume = \"bytes\"\n" + endpoint);
    r = run({exe(), "config", "check", value.string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, "resume"));
    auto key = tmp.write("key.toml", "[models.m]\nprofil = \"qwen38\"\n");
    r = run({exe(), "config", "check", key.string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, "unknown key 'models.m.profil' (did you mean 'profile'?)"));
    // serve refuses the same files the same way.
    r = run({exe(), "serve", "--config", option.string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, "unknown profile option 'thinkng'"));
}

TEST_CASE("plugins: a table row per file, rejections in one line each") {
    Site site({"good_minimal", "good_cpp", "entry_v2_only", "needs_newer_minor", "init_fails_with_message"}, "");
    auto r = run({exe(), "plugins", "--config", site.config.string()}, kNoEnvOverrides);
    CAPTURE(r.out);
    CAPTURE(r.err);
    CHECK(r.code == 5);  // optional plugins were rejected: not 0 (a script must notice)
    CHECK(has(r.err, "3 optional plugin files were rejected or failed"));
    std::istringstream lines(r.out);
    std::string line;
    std::vector<std::string> rows;
    while (std::getline(lines, line)) rows.push_back(line);
    REQUIRE(rows.size() == 6);
    CHECK(std::regex_search(rows[0], std::regex(R"(^ID +KIND +VERSION +ABI +STATUS$)")));
    auto row = [&](const std::string& key) {
        for (const auto& r2 : rows) if (has(r2, key)) return r2;
        return std::string();
    };
    CHECK(std::regex_search(row("test.good-cpp"), std::regex(R"(test\.good-cpp\s+translation\s+0\.4\.0\s+1\.4\s+loaded)")));
    CHECK(has(row("test.good-cpp"), "translation test-profile"));
    CHECK(std::regex_search(row("test.good-minimal"), std::regex(R"(controller\s+1\.2\.3\s+1\.4\s+loaded)")));
    CHECK(has(row("entry_v2_only.so"), "rejected: "));
    CHECK(has(row("entry_v2_only.so"), "built for Pulse plugin ABI v2, this host speaks v1"));
    CHECK(has(row("test.needs-newer-minor"), "requires host plugin ABI >= 1.99, this host is 1.4"));
    CHECK(has(row("test.init-fails-with-message"), "failed: "));
    CHECK(has(row("test.init-fails-with-message"), "init failed: model directory /nonexistent is missing"));
}

TEST_CASE("plugins: all loaded gives exit 0; -v shows each plugin's build description") {
    Site site({"good_minimal", "good_cpp"}, "");
    auto r = run({exe(), "plugins", "--config", site.config.string()}, kNoEnvOverrides);
    CHECK(r.code == 0);
    CHECK(!has(r.out, "built: "));
    r = run({exe(), "plugins", "--config", site.config.string(), "-v"}, kNoEnvOverrides);
    CAPTURE(r.out);
    CHECK(r.code == 0);
    CHECK(std::regex_search(r.out, std::regex(R"(\n +built: \S)")));  // PULSE_BUILD_INFO under each row
    r = run({exe(), "plugins", "--config", site.config.string(), "--bogus"}, kNoEnvOverrides);
    CHECK(r.code == 2);
}

TEST_CASE("plugins: a required plugin that fails gives exit 4") {
    Site site({"init_fails_with_message"}, "require = [\"test.init-fails-with-message\"]\n");
    auto r = run({exe(), "plugins", "--config", site.config.string()}, kNoEnvOverrides);
    CHECK(r.code == 4);
    CHECK(has(r.out, "[required]"));
    CHECK(has(r.err, "init failed: model directory /nonexistent is missing"));
}

TEST_CASE("plugins: a config that needs a profile or backend no plugin provides gives exit 4, naming it") {
    Site site({"good_cpp"}, "[models.m]\nprofile = \"qwen99\"\n[[models.m.endpoints]]\nurl = \"plugin://nowhere\"\n");
    auto r = run({exe(), "plugins", "--config", site.config.string()}, kNoEnvOverrides);
    CAPTURE(r.out);
    CAPTURE(r.err);
    CHECK(r.code == 4);
    CHECK(has(r.out, "loaded"));  // the table is still printed
    CHECK(has(r.err, "model 'm': translation profile 'qwen99' is not provided by any loaded plugin (loaded profiles: test-profile)"));
    CHECK(has(r.err, "backend 'nowhere' is not provided by any loaded plugin (loaded backends: none)"));
}

TEST_CASE("policies: one no plugin provides gives exit 4 naming it; options the policy refuses stop serve with its message") {
    Site site({"good_cpp", "faulty_policy"},
              "[models.m]\nprofile = \"test-profile\"\n[[models.m.endpoints]]\nurl = \"http://127.0.0.1:9/v1\"\n[models.m.policy]\nname = \"nope\"\n");
    auto r = run({exe(), "plugins", "--config", site.config.string()}, kNoEnvOverrides);
    CHECK(r.code == 4);
    CHECK(has(r.err, "model 'm': policy 'nope' is not provided by any loaded plugin (loaded policies: test-policy)"));
    CHECK(has(r.out, "test.policy"));
    CHECK(has(r.out, "policy"));  // the kind column
    Site refusing({"good_cpp", "faulty_policy"},
                  "[server]\nlisten = \"127.0.0.1:0\"\n[models.m]\nprofile = \"test-profile\"\n[[models.m.endpoints]]\nurl = \"http://127.0.0.1:9/v1\"\n"
                  "[models.m.policy]\nname = \"test-policy\"\n[models.m.policy.options]\nmode = \"refuse\"\n");
    r = run({exe(), "serve", "--config", refusing.config.string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, "models.m.policy.options: test-policy: refused on purpose"));
    // A policy table without a name is a config error at its line.
    TempDir tmp;
    auto bad = tmp.write("p.toml", "[models.m]\nprofile = \"x\"\n[[models.m.endpoints]]\nurl = \"http://x:1/v1\"\n[models.m.policy]\ntimeout_ms = 0\n");
    r = run({exe(), "config", "check", bad.string()}, kNoEnvOverrides);
    CHECK(r.code == 3);
    CHECK(has(r.err, "models.m.policy.timeout_ms"));
}

TEST_CASE("plugins: a binary in its build directory finds that build's plugins; a copy elsewhere the installed dir") {
    std::map<std::string, std::string> env = kNoEnvOverrides;
    auto r = run({exe(), "plugins"}, env);  // no config anywhere, no PULSE_PLUGIN_DIRS
    CAPTURE(r.out);
    CHECK(r.code == 0);
    const std::string build_plugins = fs::path(std::getenv("PULSE_PLUGIN_BUILD_DIR")).string();
    CHECK(has(r.out, "pulse.translation.qwen38"));
    CHECK(has(r.out, "loaded (" + build_plugins + "/qwen38.so"));

    TempDir tmp;  // the same binary outside its build tree behaves as an installed one
    fs::copy_file(exe(), tmp / "pulse");
    fs::permissions(tmp / "pulse", fs::perms(0755));
    r = run({(tmp / "pulse").string(), "plugins"}, env);
    CAPTURE(r.out);
    CHECK(!has(r.out, build_plugins));
    CHECK(has(r.out, "/pulse-gateway/plugins"));
}

TEST_CASE("bench: runs the pulse-bench program next to pulse, or says it is missing") {
    TempDir tmp;
    fs::copy_file(exe(), tmp / "pulse");
    fs::permissions(tmp / "pulse", fs::perms(0755));
    std::map<std::string, std::string> env = kNoEnvOverrides;
    env["PATH"] = "/usr/bin:/bin";  // no pulse-bench there
    auto r = run({(tmp / "pulse").string(), "bench", "--help"}, env);
    CHECK(r.code == 1);
    CHECK(has(r.err, "the pulse-bench program was not found (looked at " + (tmp / "pulse-bench").string() + ", then PATH)"));

    // An install puts both in BINDIR: `pulse bench` is `pulse-bench` with the same arguments.
    const fs::path bench = fs::path(exe()).parent_path().parent_path() / "tools" / "pulse-bench" / "pulse-bench";
    REQUIRE(fs::exists(bench));
    fs::copy_file(bench, tmp / "pulse-bench");
    fs::permissions(tmp / "pulse-bench", fs::perms(0755));
    auto via_pulse = run({(tmp / "pulse").string(), "bench", "--help"}, env);
    auto direct = run({(tmp / "pulse-bench").string(), "--help"}, env);
    CHECK(via_pulse.code == 0);
    CHECK(has(via_pulse.out, "usage: pulse bench [options] [command]"));
    CHECK(via_pulse.out == direct.out);
    auto bad = run({(tmp / "pulse").string(), "bench", "nonsense"}, env);
    CHECK(bad.code == 2);
    CHECK(has(bad.err, "pulse bench: The following argument was not expected: nonsense"));
}

TEST_CASE("decode and gguf: run the pulse-decoder program; the host binary links none of the decoder") {
    // The host stays minimal: no ICU (the tokenizer's), no OpenMP (the matmuls').
    auto elf = run({"readelf", "-d", exe()});
    REQUIRE(elf.code == 0);
    CHECK(has(elf.out, "(NEEDED)"));
    CHECK_FALSE(has(elf.out, "libicu"));
    CHECK_FALSE(has(elf.out, "libgomp"));
    auto syms = run({"nm", "-C", exe()});
    CHECK_FALSE(has(syms.out, "pulse::decoder::"));

    TempDir tmp;
    auto demo = run({exe(), "gguf", "make-demo", (tmp / "demo.gguf").string()});
    CHECK(demo.code == 0);
    CHECK(has(demo.out, "RANDOM weights"));
    auto info = run({exe(), "gguf", "info", (tmp / "demo.gguf").string()});
    CHECK(info.code == 0);
    CHECK(has(info.out, "general.architecture"));
    CHECK(has(info.out, "qwen35"));
    CHECK(has(info.out, "MTP block: none (no qwen35.nextn_predict_layers)"));
    // With --mtp the demo carries a (random) MTP block; info says where and what it shares.
    auto mtp_demo = run({exe(), "gguf", "make-demo", "--mtp", (tmp / "mtp.gguf").string()});
    CHECK(mtp_demo.code == 0);
    auto mtp_info = run({exe(), "gguf", "info", (tmp / "mtp.gguf").string()});
    CHECK(mtp_info.code == 0);
    CHECK(has(mtp_info.out, "MTP block: 1 at blk.2 (nextn: eh_proj enorm hnorm shared_head_norm); embedding and output head shared with the main model"));
    CHECK(has(mtp_info.out, "blk.2.nextn.eh_proj.weight"));
    CHECK(run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2,3", "-n", "2", "--json"}).code == 0);
    CHECK(run({exe(), "gguf", "make-demo", "--mtp", "a.gguf", "b.gguf"}).code == 2);
    // Speculative decoding with that block: the same tokens as plain greedy decoding, and what
    // drafting did. (--exact: the int8 path's batched and single-row logits may differ by rounding.)
    auto ids = [](const std::string& json) {
        std::vector<std::string> out;
        const std::string tokens = json.substr(0, json.find("\"text\""));
        std::regex re(R"(\{"id":(\d+))");
        for (std::sregex_iterator it(tokens.begin(), tokens.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
        return out;
    };
    auto plain = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2,3", "-n", "24", "--json", "--exact"});
    auto drafted = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2,3", "-n", "24", "--json", "--exact", "--draft", "mtp", "--draft-k", "3"});
    CHECK(plain.code == 0);
    CHECK(drafted.code == 0);
    CHECK(ids(plain.out).size() >= 1);
    CHECK(ids(drafted.out) == ids(plain.out));
    CHECK(has(drafted.out, R"("speculation":{"draft":"mtp","k":3,"adaptive":false,"plain_steps":0,"steps":)"));
    // Adaptive k: the demo's random block is never right, so drafting stops after at most 20
    // rejections (the first draft's rate falls by 7/8 a rejection from 0.7, below the lowest
    // threshold, 0.05, after 20), then one probe in 16 steps; the tokens stay plain greedy
    // decoding's, and --json says what the threshold came to.
    auto plain64 = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2,3", "-n", "64", "--json", "--exact"});
    auto adaptive = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2,3", "-n", "64", "--json", "--exact", "--draft", "mtp", "--draft-k", "auto:4"});
    CHECK(adaptive.code == 0);
    CHECK(ids(adaptive.out) == ids(plain64.out));
    std::smatch plain_steps;
    REQUIRE(std::regex_search(adaptive.out, plain_steps, std::regex(R"("adaptive":true,"plain_steps":(\d+))")));
    CHECK(std::stoi(plain_steps[1]) >= 30);
    std::smatch worth;
    REQUIRE(std::regex_search(adaptive.out, worth, std::regex(R"("draft_cost":\{"worth":([0-9.e-]+),"seconds_per_draft":([0-9.e-]+),"seconds_per_token":([0-9.e-]+)\})")));
    CHECK(std::stod(worth[1]) >= 0.05);
    CHECK(std::stod(worth[1]) <= 1.0);
    CHECK(std::stod(worth[3]) > 0);
    CHECK_FALSE(has(drafted.out, "draft_cost"));  // fixed k: no threshold
    CHECK(has(drafted.out, R"("acceptance_by_position":[)"));
    // Where the steps' time went: each phase timed. (Which takes the most is for benchmarks: on
    // a loaded machine a preemption lands in any of them.)
    std::smatch secs;
    REQUIRE(std::regex_search(drafted.out, secs, std::regex(R"("seconds":\{"draft":([0-9.e-]+),"verify":([0-9.e-]+),"settle":([0-9.e-]+)\})")));
    CHECK(std::stod(secs[1]) > 0);
    CHECK(std::stod(secs[2]) > 0);
    CHECK(std::stod(secs[3]) > 0);
    CHECK_FALSE(has(plain.out, "speculation"));
    auto no_block = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2", "--draft", "mtp"});
    CHECK(no_block.code == 3);
    CHECK(has(no_block.err, "has no MTP block"));
    auto sampled = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--draft", "mtp", "--temperature", "0.7", "--seed", "3", "--json"});
    CHECK(sampled.code == 0);
    CHECK(has(sampled.out, R"("speculation":{"draft":"mtp","k":4,"adaptive":false,)"));
    CHECK(run({exe(), "decode", (tmp / "mtp.gguf").string(), "--prompt", "hi", "--draft", "mtp", "--streams", "2", "-n", "3"}).code == 0);  // the engine drafts too
    CHECK(run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--draft", "mtp", "--draft-k", "0"}).code == 2);
    CHECK(run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--draft", "eagle"}).code == 2);
    // Synthetic acceptance (benchmarking): with drafts only, 1..k+1 tokens per step, said loudly.
    auto synth = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "-n", "12", "--draft", "mtp", "--draft-k", "2",
                      "--synthetic-acceptance", "3", "--json"});
    CHECK(synth.code == 0);
    CHECK(has(synth.out, R"("synthetic_acceptance":3)"));
    CHECK(has(synth.err, "the text is not the model's"));
    CHECK(run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--synthetic-acceptance", "2"}).code == 2);
    CHECK(run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--draft", "mtp", "--draft-k", "2", "--synthetic-acceptance", "3.5"}).code == 2);
    // Self-distillation data from a JSONL prompt set: a raw prompt and a chat request.
    {
        std::ofstream p(tmp / "prompts.jsonl");
        p << R"({"prompt":"<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"})" << "\n\n"
          << R"({"messages":[{"role":"user","content":"write a loop"}]})" << "\n";
    }
    auto collect = run({exe(), "distill", "collect", (tmp / "mtp.gguf").string(), "--prompts", (tmp / "prompts.jsonl").string(), "--out",
                        (tmp / "data").string(), "-n", "8"});
    CHECK(collect.code == 0);
    CHECK(has(collect.out, "2 sequences"));
    CHECK(has(collect.out, "(16 generated)"));
    for (const char* f : {"tokens.npy", "hidden.npy", "starts.npy", "generated_from.npy", "meta.json"}) CHECK(std::filesystem::exists(tmp / "data" / f));
    // Several sampled continuations per prompt; repeated greedy ones are refused.
    auto several = run({exe(), "distill", "collect", (tmp / "mtp.gguf").string(), "--prompts", (tmp / "prompts.jsonl").string(), "--out",
                        (tmp / "sampled").string(), "-n", "4", "--samples", "3", "--temperature", "0.8", "--batch", "2"});
    CHECK(several.code == 0);
    CHECK(has(several.out, "6 sequences"));
    auto greedy_copies = run({exe(), "distill", "collect", (tmp / "mtp.gguf").string(), "--prompts", (tmp / "prompts.jsonl").string(), "--out",
                              (tmp / "copies").string(), "--samples", "2"});
    CHECK(greedy_copies.code == 2);
    CHECK(has(greedy_copies.err, "give --temperature > 0"));
    CHECK(run({exe(), "distill", "collect", (tmp / "mtp.gguf").string(), "--prompts", (tmp / "prompts.jsonl").string(), "--out", (tmp / "b").string(),
               "--batch", "65"}).code == 2);
    {
        std::ofstream p(tmp / "bad.jsonl");
        p << R"({"prompt":"fine"})" << "\n" << R"({"text":"no"})" << "\n";
    }
    auto bad = run({exe(), "distill", "collect", (tmp / "mtp.gguf").string(), "--prompts", (tmp / "bad.jsonl").string(), "--out", (tmp / "bad").string()});
    CHECK(bad.code == 2);
    CHECK(has(bad.err, "bad.jsonl:2: needs \"prompt\""));
    // A draft vocabulary from the collected tokens and a text file; decoding drafts within it.
    {
        std::ofstream p(tmp / "code.txt");
        p << "for i in range(10):\n    print(i)\n";
    }
    auto vocab = run({exe(), "distill", "vocab", (tmp / "mtp.gguf").string(), (tmp / "data").string(), (tmp / "code.txt").string(), "--out",
                      (tmp / "vocab.txt").string(), "--top", "20"});
    CHECK(vocab.code == 0);
    CHECK(has(vocab.out, "wrote " + (tmp / "vocab.txt").string() + ": 20 of "));
    auto narrowed = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2,3", "-n", "24", "--json", "--exact", "--draft", "mtp", "--draft-k", "3",
                         "--draft-vocab", (tmp / "vocab.txt").string()});
    CHECK(narrowed.code == 0);
    CHECK(ids(narrowed.out) == ids(plain.out));
    CHECK(has(narrowed.out, "\"draft_vocab\":\"" + (tmp / "vocab.txt").string() + "\""));
    auto first_ids = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2,3", "-n", "24", "--json", "--exact", "--draft", "mtp", "--draft-k", "3",
                          "--draft-vocab", "first:300"});
    CHECK(first_ids.code == 0);
    CHECK(ids(first_ids.out) == ids(plain.out));
    CHECK(has(first_ids.out, "\"draft_vocab\":\"first:300\""));
    auto first_bad = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--draft", "mtp", "--draft-vocab", "first:0"});
    CHECK(first_bad.code == 2);
    CHECK(has(first_bad.err, "first:N takes N from 1 to the model's 509 tokens"));
    CHECK(run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--draft-vocab", (tmp / "vocab.txt").string()}).code == 2);  // no --draft mtp
    {
        std::ofstream p(tmp / "bad-vocab.txt");
        p << "3\nthree\n";
    }
    auto bad_vocab = run({exe(), "decode", (tmp / "mtp.gguf").string(), "--tokens", "1,2", "--draft", "mtp", "--draft-vocab", (tmp / "bad-vocab.txt").string()});
    CHECK(bad_vocab.code == 2);
    CHECK(has(bad_vocab.err, "bad-vocab.txt:2: 'three' is not a token id"));
    // Held-out text: the share of its tokens the list misses, for the list and for shorter ones.
    {
        std::ofstream(tmp / "ranked.txt") << "xxxxyyz";  // x 4, y 2, z 1 (one token a byte in this vocabulary)
        std::ofstream(tmp / "held.txt") << "xyzzw";
        std::ofstream(tmp / "empty.txt") << "";
    }
    auto held = run({exe(), "distill", "vocab", (tmp / "mtp.gguf").string(), (tmp / "ranked.txt").string(), "--out", (tmp / "v2.txt").string(), "--top",
                     "2", "--held-out", (tmp / "held.txt").string()});
    CHECK(held.code == 0);
    CHECK(has(held.out, ": 2 of 509 tokens, covering 0.8571 of the 7 counted"));
    CHECK(has(held.out, "held out: 0.4000 of their 5 tokens are listed; 0.6000 are not"));
    CHECK(has(held.out, "| 1 | 0.5714 | 0.8000 | 1.0000 |\n| 2 | 0.8571 | 0.6000 | 1.0000 |\n| all 3 seen | 1.0000 | 0.2000 | 1.0000 |\n"));
    auto held_missing = run({exe(), "distill", "vocab", (tmp / "mtp.gguf").string(), (tmp / "ranked.txt").string(), "--out", (tmp / "v2.txt").string(),
                             "--held-out", (tmp / "nothing.txt").string()});
    CHECK(held_missing.code == 3);
    CHECK(has(held_missing.err, "cannot read " + (tmp / "nothing.txt").string()));
    auto held_empty = run({exe(), "distill", "vocab", (tmp / "mtp.gguf").string(), (tmp / "ranked.txt").string(), "--out", (tmp / "v2.txt").string(),
                           "--held-out", (tmp / "empty.txt").string()});
    CHECK(held_empty.code == 3);
    CHECK(has(held_empty.err, "the held-out sources hold no token"));
    CHECK(run({exe(), "distill", "vocab", (tmp / "mtp.gguf").string(), (tmp / "ranked.txt").string(), "--out", (tmp / "v2.txt").string(), "--held-out"}).code ==
          2);
    CHECK(run({exe(), "distill", "vocab", (tmp / "mtp.gguf").string(), "--out", (tmp / "v.txt").string()}).code == 2);  // no source
    auto no_source = run({exe(), "distill", "vocab", (tmp / "mtp.gguf").string(), (tmp / "missing").string(), "--out", (tmp / "v.txt").string()});
    CHECK(no_source.code == 3);
    CHECK(has(no_source.err, "cannot read"));
    CHECK(run({exe(), "distill", "collect", (tmp / "mtp.gguf").string()}).code == 2);
    CHECK(run({exe(), "distill", "train"}).code == 2);
    CHECK(run({exe(), "distill", "--help"}).code == 0);
    auto dec = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2,3", "-n", "2", "--json"});
    CHECK(dec.code == 0);
    CHECK(has(dec.out, "\"decode_tokens_per_s\""));
    CHECK(has(dec.out, "\"work_bytes\""));
    CHECK(run({exe(), "gguf", "info", (tmp / "missing.gguf").string()}).code == 3);
    CHECK(run({exe(), "decode"}).code == 2);
    // The compute device: the build's own by name; another is refused naming what exists, on
    // the command line and as an endpoint option (before any model file is read).
    auto cpu = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2", "-n", "1", "--device", "cpu", "--json"});
    CHECK(cpu.code == 0);
    CHECK(has(cpu.out, "\"device\":\"cpu\""));
    auto tpu = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2", "--device", "tpu"});
    CHECK(tpu.code == 2);
    CHECK(has(tpu.err, "decoder device 'tpu' is not in this build (it has: cpu"));
    // The default says which device it took and why, in the JSON (and at INFO when serving).
    auto dflt = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2", "-n", "1", "--json"});
    CHECK(dflt.code == 0);
    CHECK((has(dflt.out, "\"device_note\":\"device cpu (") || has(dflt.out, "\"device_note\":\"device cuda (")));
    // "cuda" where the build or the machine lacks it: exit 2 with the reason, never a crash.
    auto cuda = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2", "-n", "1", "--device", "cuda", "--json"});
    if (cuda.code == 2) CHECK((has(cuda.err, "decoder device 'cuda' is not in this build") || has(cuda.err, "decoder device 'cuda' is unavailable here: ")));
    else CHECK(has(cuda.out, "\"device\":\"cuda\""));
    auto cfg = tmp.write("dev.toml", "[server]\nlisten = \"127.0.0.1:0\"\n[plugins]\ndirs = [\"" + std::string(std::getenv("PULSE_PLUGIN_BUILD_DIR")) +
                                         "\"]\ndropin_dirs = []\n[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"decoder://" +
                                         (tmp / "absent.gguf").string() + "\"\n[models.m.endpoints.options]\ndevice = \"tpu\"\n");
    auto serve = run({exe(), "serve", "--config", cfg.string()}, kNoEnvOverrides, 30);
    CHECK(serve.code == 3);
    CHECK(has(serve.err, "backend 'decoder': create failed: decoder: device 'tpu' is not in this build (it has: cpu"));
    // Batching options out of range stop `pulse serve` naming the option.
    auto decoder_cfg = [&](const std::string& name, const std::string& option) {
        return tmp.write(name, "[server]\nlisten = \"127.0.0.1:0\"\n[plugins]\ndirs = [\"" + std::string(std::getenv("PULSE_PLUGIN_BUILD_DIR")) +
                                   "\"]\ndropin_dirs = []\n[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"decoder://" +
                                   (tmp / "demo.gguf").string() + "\"\n[models.m.endpoints.options]\n" + option + "\n");
    };
    for (const auto& [option, message] : {std::pair{"max_sequences = 0", "decoder: option 'max_sequences' must be 1 to 32, not 0"},
                                          std::pair{"checkpoints = -1", "decoder: option 'checkpoints' must be 0 (two per max_sequences) or more"},
                                          std::pair{"draft = \"eagle\"", "decoder: option draft must be \"off\", \"mtp\" (the file's MTP block) or \"model:PATH\""},
                                          std::pair{"draft_k = 0", "decoder: option 'draft_k' must be 1 to 16, not 0"},
                                          std::pair{"draft = \"mtp\"", "draft = \"mtp\" but the file has no MTP block"}}) {
        auto bad = run({exe(), "serve", "--config", decoder_cfg("bad.toml", option).string()}, kNoEnvOverrides, 30);
        CHECK(bad.code == 3);
        CHECK(has(bad.err, message));
    }
    // The old opt-in for int8 activations (now the default) says what replaced it.
    auto old = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1", "--int8-prefill"});
    CHECK(old.code == 2);
    CHECK(has(old.err, "--int8-prefill is gone: int8 activations are the default; --exact turns them off"));
    auto exact = run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2", "-n", "2", "--exact"});
    CHECK(exact.code == 0);
    // Several requests at once through the serving engine: one batch, every stream its tokens.
    auto streams = run({exe(), "decode", (tmp / "demo.gguf").string(), "--prompt", "hi", "--streams", "3", "-n", "5"});
    CHECK(streams.code == 0);
    CHECK(has(streams.out, "\"streams\":3,\"max_sequences\":3,"));
    CHECK(has(streams.out, "\"completion_tokens\":[5,5,5]"));
    CHECK(has(streams.out, "\"peak_batch\":3"));
    // Drafting in the serving engine: the demo file drafting for itself keeps every draft.
    auto batched_drafts = run({exe(), "decode", (tmp / "demo.gguf").string(), "--prompt", "hi", "--streams", "2", "-n", "9", "--draft",
                        "model:" + (tmp / "demo.gguf").string(), "--draft-k", "3"});
    CHECK(batched_drafts.code == 0);
    CHECK(has(batched_drafts.out, "\"completion_tokens\":[9,9]"));
    CHECK(has(batched_drafts.out, "\"speculation\":{\"draft\":\"model:"));
    CHECK(has(batched_drafts.out, "\"acceptance\":1.0,"));
    auto queued = run({exe(), "decode", (tmp / "demo.gguf").string(), "--prompt", "hi", "--streams", "3", "--max-sequences", "1", "-n", "5"});
    CHECK(queued.code == 0);
    CHECK(has(queued.out, "\"peak_batch\":1"));
    CHECK(run({exe(), "decode", (tmp / "demo.gguf").string(), "--tokens", "1,2", "--streams", "2"}).code == 2);
    CHECK(run({exe(), "decode", (tmp / "demo.gguf").string(), "--prompt", "hi", "--streams", "2", "--max-sequences", "33"}).code == 2);

    // A copy of pulse with no pulse-decoder beside it or on PATH says so.
    fs::copy_file(exe(), tmp / "pulse");
    fs::permissions(tmp / "pulse", fs::perms(0755));
    std::map<std::string, std::string> env = kNoEnvOverrides;
    env["PATH"] = "/usr/bin:/bin";
    auto missing = run({(tmp / "pulse").string(), "decode", "x.gguf"}, env);
    CHECK(missing.code == 1);
    CHECK(has(missing.err, "the pulse-decoder program was not found (looked at " + (tmp / "pulse-decoder").string() + ", then PATH)"));
}

TEST_CASE("model: runs the runtime controller plugin's command") {
    Site site({"good_minimal"}, "");
    auto r = run({exe(), "model", "--config", site.config.string(), "up", "best", "--node", "n1"}, kNoEnvOverrides);
    CHECK(r.out == "args: up best --node n1\n");
    CHECK(r.code == 4);  // the test controller exits with its argc

    Site empty({}, "");
    r = run({exe(), "model", "--config", empty.config.string(), "status"}, kNoEnvOverrides);
    CHECK(r.code == 4);
    CHECK(has(r.err, "no runtime controller plugin is loaded"));
}

TEST_CASE("model: the shipped controller with the shipped config lists the shipped profiles") {
    std::map<std::string, std::string> env = kNoEnvOverrides;
    env["PULSE_PLUGIN_DIRS"] = std::getenv("PULSE_PLUGIN_BUILD_DIR");
    const std::string cfg = std::string(PULSE_SOURCE_ROOT) + "/config/pulse.toml";
    auto r = run({exe(), "model", "--config", cfg, "profiles"}, env);
    CHECK(r.code == 0);
    for (const char* p : {"qwen38/best", "qwen38/datagen", "qwen38/capture", "qwen38/tp2"}) CHECK(has(r.out, p));
    // The example nodes file parses; its site path fills the MTP head mount.
    r = run({exe(), "model", "--config", cfg, "render", "best", "--node", "spark1"}, env);
    CHECK(r.code == 0);
    CHECK(has(r.out, "EXTRA_DOCKER_ARGS='-v /srv/models/qwen38-mtp-head/mtp.safetensors:/opt/pulse/mtp-head.safetensors:ro'"));
    // The dry run of the example node shows the ssh transport and runs nothing.
    r = run({exe(), "model", "--config", cfg, "up", "best", "--node", "spark1", "--dry-run"}, env);
    CHECK(r.code == 0);
    CHECK(has(r.out, "steps run with: ssh -o BatchMode=yes -o ConnectTimeout=10 ops@spark1.lan bash -s"));
    // An unknown [controller] key is a config error from the plugin.
    Site bad({}, "[controller]\nnodez = \"x\"\n");
    fs::copy_file(std::string(std::getenv("PULSE_PLUGIN_BUILD_DIR")) + "/recipe.so", bad.tmp / "plugins/recipe.so");
    r = run({exe(), "model", "--config", bad.config.string(), "profiles"}, kNoEnvOverrides);
    CHECK(r.code != 0);
    CHECK(has(r.err, "[controller]: unknown key 'nodez'"));
}

TEST_CASE("serve: refuses to start when a model's profile is missing") {
    Site site({"good_minimal"}, R"(
[server]
listen = "127.0.0.1:0"
[models.m]
profile = "qwen38"
[[models.m.endpoints]]
url = "http://127.0.0.1:9/v1"
)");
    auto r = run({exe(), "serve", "--config", site.config.string()}, kNoEnvOverrides, 30);
    CHECK(r.code == 4);
    CHECK(has(r.err, "model 'm': translation profile 'qwen38' is not provided by any loaded plugin (loaded profiles: none)"));
}

TEST_CASE("serve: a second gateway on a busy port fails loudly instead of sharing it") {
    Site site({"good_cpp", "example_echo"}, "[models.echo]\nprofile = \"test-profile\"\n[[models.echo.endpoints]]\nurl = \"plugin://example-echo\"\n");
    // The holder sets SO_REUSEPORT, so a gateway that also set it would share the port silently.
    Poco::Net::ServerSocket holder;
    holder.bind(Poco::Net::SocketAddress("127.0.0.1", 0), /*reuseAddress=*/true, /*reusePort=*/true);
    holder.listen();
    std::string text = pulse::test::read_file(site.config);
    std::ofstream(site.config) << "[server]\nlisten = \"127.0.0.1:" << holder.address().port() << "\"\n" << text;
    auto r = run({exe(), "serve", "--config", site.config.string()}, kNoEnvOverrides, 30);
    CHECK(r.code == 1);
    CHECK(has(r.err, "cannot listen on 127.0.0.1:" + std::to_string(holder.address().port())));
}

TEST_CASE("serve: without a config file is a config error") {
    auto r = run({exe(), "serve", "--config", "/nonexistent/pulse.toml"}, kNoEnvOverrides);
    CHECK(r.code == 3);
}

TEST_CASE("serve: starts, answers /health and /v1/models, drains on SIGTERM") {
    Site site({"good_cpp", "example_echo"}, R"(
[server]
listen = "127.0.0.1:0"
[models.echo]
profile = "test-profile"
context_window = 4096
[[models.echo.endpoints]]
name = "inproc"
url = "plugin://example-echo"
)");
    pulse::test::Child child({exe(), "serve", "--config", site.config.string()}, kNoEnvOverrides);
    // Wait (bounded) for the "listening on" line to learn the port.
    std::smatch m;
    std::string log;
    static const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 500 && !std::regex_search(log, m, listening); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        log = child.stderr_so_far();
    }
    REQUIRE_MESSAGE(std::regex_search(log, m, listening), log);
    uint16_t port = static_cast<uint16_t>(std::stoi(m[1]));

    auto get = [&](const std::string& path, std::string& body) {
        Poco::Net::HTTPClientSession s("127.0.0.1", port);
        s.setTimeout(Poco::Timespan(5, 0));
        Poco::Net::HTTPRequest req("GET", path, Poco::Net::HTTPMessage::HTTP_1_1);
        s.sendRequest(req);
        Poco::Net::HTTPResponse resp;
        std::istream& in = s.receiveResponse(resp);
        body.assign(std::istreambuf_iterator<char>(in), {});
        return static_cast<int>(resp.getStatus());
    };
    std::string body;
    CHECK(get("/health", body) == 200);
    CHECK(has(body, R"("status":"ok")"));
    CHECK(has(body, R"("url":"plugin://example-echo")"));
    CHECK(get("/v1/models", body) == 200);
    CHECK(has(body, R"("id":"echo")"));
    CHECK(has(body, R"("context_window":4096)"));
    CHECK(get("/nope", body) == 404);
    CHECK(has(body, R"("type":"invalid_request_error")"));

    child.signal(SIGTERM);
    auto r = child.wait(30);
    CHECK(r.code == 0);
    CHECK(has(r.err, "received SIGTERM: draining"));
    CHECK(has(r.err, "stopped"));
}

// ---------------------------------------------------------------------------------------------
// pulse codex
// ---------------------------------------------------------------------------------------------

namespace {

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// A gateway serving model "echo" through the in-process example backend (always healthy).
struct EchoGateway {
    Site site;
    std::unique_ptr<pulse::test::Child> child;
    uint16_t port = 0;
    explicit EchoGateway(const std::string& extra_server = "", const std::string& extra_models = "", const std::string& echo_keys = "")
        : site({"good_cpp", "example_echo"}, "[server]\nlisten = \"127.0.0.1:0\"\n" + extra_server +
                                                  "[upstream]\nhealth_interval_s = 0.2\n"
                                                  "[models.echo]\nprofile = \"test-profile\"\ncontext_window = 65536\n" + echo_keys +
                                                  "[[models.echo.endpoints]]\nurl = \"plugin://example-echo\"\n" + extra_models) {
        child = std::make_unique<pulse::test::Child>(std::vector<std::string>{exe(), "serve", "--config", site.config.string()},
                                                     kNoEnvOverrides);
        std::smatch m;
        static const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
        std::string log;
        for (int i = 0; i < 500 && !std::regex_search(log, m, listening); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            log = child->stderr_so_far();
        }
        REQUIRE_MESSAGE(std::regex_search(log, m, listening), log);
        port = static_cast<uint16_t>(std::stoi(m[1]));
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
    std::string health() const {
        Poco::Net::HTTPClientSession s("127.0.0.1", port);
        s.setTimeout(Poco::Timespan(5, 0));
        Poco::Net::HTTPRequest req("GET", "/health", Poco::Net::HTTPMessage::HTTP_1_1);
        s.sendRequest(req);
        Poco::Net::HTTPResponse resp;
        std::istream& in = s.receiveResponse(resp);
        return std::string(std::istreambuf_iterator<char>(in), {});
    }
};

std::string fake_codex() { return PULSE_SOURCE_ROOT "/tests/cli/fake_codex.sh"; }

}  // namespace

TEST_CASE("codex: no gateway running gives a clear message and how to start one") {
    TempDir tmp;
    auto r = run({exe(), "codex", "--gateway", "http://127.0.0.1:1", "--codex", fake_codex()},
                 {{"FAKE_CODEX_OUT", (tmp / "argv").string()}, {"PULSE_CONFIG", ""}});
    CHECK(r.code == 1);
    CHECK(has(r.err, "no Pulse gateway at http://127.0.0.1:1"));
    CHECK(has(r.err, "pulse serve"));
    CHECK(has(r.err, "--start-gateway"));
    CHECK_FALSE(fs::exists(tmp / "argv"));  // codex was not started
}

TEST_CASE("codex: provider, catalog, model and compaction settings go to codex as -c flags") {
    EchoGateway gw;
    TempDir tmp;
    auto out = tmp / "argv";
    auto r = run({exe(), "codex", "--gateway", gw.url() + "/v1", "--codex", fake_codex(), "--", "exec", "fix the test"},
                 {{"FAKE_CODEX_OUT", out.string()}, {"FAKE_CODEX_EXIT", "7"}, {"PULSE_GATEWAY_API_KEY", ""}});
    CAPTURE(r.err);
    CHECK(r.code == 7);  // codex's own exit code
    auto argv = lines_of(pulse::test::read_file(out));
    auto has_arg = [&](const std::string& a) { return std::find(argv.begin(), argv.end(), a) != argv.end(); };
    CHECK(has_arg("model_provider=\"pulse\""));
    CHECK(has_arg("model_providers.pulse={name=\"pulse\",base_url=\"" + gw.url() +
                  "/v1\",wire_api=\"responses\",stream_idle_timeout_ms=300000}"));
    CHECK(has_arg("model=\"echo\""));
    CHECK(has_arg("model_context_window=65536"));
    CHECK(has_arg("model_auto_compact_token_limit=58982"));
    REQUIRE(argv.size() >= 2);
    CHECK(argv[argv.size() - 2] == "exec");
    CHECK(argv.back() == "fix the test");
    // The catalog Codex 0.169 needs for this model.
    rapidjson::Document cat;
    cat.Parse(pulse::test::read_file(fs::path(out.string() + ".catalog")).c_str());
    REQUIRE(cat.IsObject());
    const auto& m0 = cat["models"][0];
    CHECK(std::string(m0["slug"].GetString()) == "echo");
    CHECK(m0["context_window"].GetInt() == 65536);
    CHECK(std::string(m0["apply_patch_tool_type"].GetString()) == "freeform");
    for (const char* k : {"display_name", "supported_reasoning_levels", "shell_type", "visibility", "supported_in_api", "priority",
                          "support_verbosity", "truncation_policy", "experimental_supported_tools", "base_instructions"})
        CHECK_MESSAGE(m0.HasMember(k), k);
    // ~/.codex is not touched: everything is on the command line.
    CHECK(pulse::test::read_file(fs::path(out.string() + ".env")) == "PULSE_GATEWAY_API_KEY=\n");
}

TEST_CASE("codex: the task-continuity hooks for this run, with the trust bypass they need, unless --no-continuity") {
    EchoGateway gw;
    TempDir tmp;
    auto out = tmp / "argv";
    auto r = run({exe(), "codex", "--gateway", gw.url(), "--codex", fake_codex(), "--", "exec", "x"},
                 {{"FAKE_CODEX_OUT", out.string()}, {"PULSE_GATEWAY_API_KEY", ""}});
    CHECK(r.code == 0);
    auto argv = lines_of(pulse::test::read_file(out));
    auto has_arg = [&](const std::string& a) { return std::find(argv.begin(), argv.end(), a) != argv.end(); };
    const std::string handler = "{type=\"command\",command=\"" + fs::canonical(exe()).string() + " continuity hook\",timeout=10}";
    for (const char* ev : {"SessionStart", "UserPromptSubmit", "PostToolUse", "PreCompact", "PostCompact", "Stop"})
        CHECK_MESSAGE(has_arg(std::string("hooks.") + ev + "=[{hooks=[" + handler + "]}]"), ev);
    CHECK(has_arg("--dangerously-bypass-hook-trust"));
    CHECK(has(r.err, "task continuity on"));  // and says what the bypass means
    CHECK(has(r.err, "--no-continuity"));
    r = run({exe(), "codex", "--gateway", gw.url(), "--codex", fake_codex(), "--no-continuity", "--", "exec", "x"},
            {{"FAKE_CODEX_OUT", out.string()}, {"PULSE_GATEWAY_API_KEY", ""}});
    CHECK(r.code == 0);
    std::string text = pulse::test::read_file(out);
    CHECK_FALSE(has(text, "hooks."));
    CHECK_FALSE(has(text, "--dangerously-bypass-hook-trust"));
}

TEST_CASE("continuity: the hook never blocks Codex; show, clear and list for people") {
    TempDir tmp;
    std::map<std::string, std::string> env = {{"XDG_STATE_HOME", tmp.path().string()}};
    auto hook = [&](const std::string& input) { return run({"/bin/sh", "-c", "printf '%s' \"$1\" | \"$2\" continuity hook", "sh", input, exe()}, env); };
    auto r = hook("this is not json");
    CHECK(r.code == 0);  // Codex goes on
    CHECK(r.out.empty());
    CHECK(has(r.err, "pulse continuity: the hook input is not a JSON object (the task goes on without it)"));
    const std::string sid = "0199aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee";
    r = hook(R"({"session_id":")" + sid + R"(","hook_event_name":"UserPromptSubmit","cwd":"/p","prompt":"fix the failing test"})");
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    r = hook(R"({"session_id":")" + sid + R"(","hook_event_name":"SessionStart","cwd":"/p","source":"compact"})");
    CHECK(r.code == 0);
    rapidjson::Document d;
    d.Parse(r.out.c_str());
    REQUIRE_MESSAGE(d.IsObject(), r.out);
    CHECK(has(d["hookSpecificOutput"]["additionalContext"].GetString(), "- fix the failing test"));
    r = run({exe(), "continuity", "list"}, env);
    CHECK(r.code == 0);
    CHECK(has(r.out, sid + "  "));
    r = run({exe(), "continuity", "show", sid}, env);
    CHECK(r.code == 0);
    CHECK(has(r.out, "- fix the failing test"));
    CHECK(run({exe(), "continuity", "clear", sid}, env).code == 0);
    r = run({exe(), "continuity", "show", sid}, env);
    CHECK(r.code == 1);
    CHECK(has(r.err, "no task state recorded for session " + sid));
    r = run({exe(), "continuity", "show", "../etc"}, env);
    CHECK(r.code == 2);
    CHECK(has(r.err, "'../etc' is not a Codex session id"));
    CHECK(run({exe(), "continuity"}, env).code == 2);
    // hooks-json: a hooks.json for plain codex, every event on this binary.
    r = run({exe(), "continuity", "hooks-json"}, env);
    CHECK(r.code == 0);
    rapidjson::Document h;
    h.Parse(r.out.c_str());
    REQUIRE_MESSAGE(h.IsObject(), r.out);
    CHECK(h["hooks"].MemberCount() == 6);
    CHECK(std::string(h["hooks"]["SessionStart"][0]["hooks"][0]["command"].GetString()) == fs::canonical(exe()).string() + " continuity hook");
}

TEST_CASE("codex: unknown model and a model without a healthy backend are refused") {
    EchoGateway gw("", "[models.dead]\nprofile = \"test-profile\"\n[[models.dead.endpoints]]\nurl = \"http://127.0.0.1:1/v1\"\n");
    TempDir tmp;
    auto r = run({exe(), "codex", "--gateway", gw.url(), "--model", "nope", "--codex", fake_codex()},
                 {{"FAKE_CODEX_OUT", (tmp / "a").string()}});
    CHECK(r.code == 1);
    CHECK(has(r.err, "the gateway has no model 'nope' (it has: echo, dead)"));
    // Wait (bounded) for the probe to mark the dead endpoint down.
    for (int i = 0; i < 100; ++i) {
        r = run({exe(), "codex", "--gateway", gw.url(), "--model", "dead", "--codex", fake_codex()}, {{"FAKE_CODEX_OUT", (tmp / "a").string()}});
        if (has(r.err, "no healthy backend")) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CHECK(r.code == 1);
    CHECK(has(r.err, "model 'dead' has no healthy backend right now"));
    CHECK(has(r.err, "(http://127.0.0.1:1/v1): down"));
}

TEST_CASE("codex: says which model it picked and why; a demo model (random weights) only when named") {
    TempDir tmp;
    auto go = [&](const EchoGateway& gw, std::vector<std::string> extra = {}) {
        std::vector<std::string> argv = {exe(), "codex", "--gateway", gw.url(), "--codex", fake_codex(), "--no-continuity"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        return run(argv, {{"FAKE_CODEX_OUT", (tmp / "argv").string()}, {"PULSE_GATEWAY_API_KEY", ""}});
    };
    {
        // The demo model is first and healthy, the real one (vLLM, down) second: the real one is
        // picked, and said to have no healthy backend, rather than random text served silently.
        EchoGateway gw("", "[models.vllm]\nprofile = \"test-profile\"\n[[models.vllm.endpoints]]\nurl = \"http://127.0.0.1:1/v1\"\n",
                       "demo = true\n");
        CHECK(has(gw.health(), R"("demo":true,"endpoints")"));
        auto r = go(gw);
        CHECK(r.code == 1);
        CHECK(has(r.err, "pulse codex: model vllm (the first model in the config"));
        CHECK_FALSE(fs::exists(tmp / "argv"));
        r = go(gw, {"--model", "echo"});
        CHECK(r.code == 0);
        CHECK(has(r.err, "pulse codex: model echo (named with --model); a demo model: its weights are random"));
    }
    {
        EchoGateway only_demo("", "", "demo = true\n");
        auto r = go(only_demo);
        CHECK(r.code == 1);
        CHECK(has(r.err, "the gateway serves only the demo model echo, whose weights are random"));
        CHECK(has(r.err, "pulse codex --model echo"));
    }
    {
        EchoGateway gw;
        auto r = go(gw);
        CHECK(r.code == 0);
        CHECK(has(r.err, "pulse codex: model echo (the first model in the config with a healthy backend)"));
    }
}

TEST_CASE("codex: an API key is passed by name, never on the command line") {
    EchoGateway gw("api_key = \"k3y\"\n");
    TempDir tmp;
    auto out = tmp / "argv";
    auto r = run({exe(), "codex", "--gateway", gw.url(), "--codex", fake_codex()}, {{"FAKE_CODEX_OUT", out.string()}, {"PULSE_GATEWAY_API_KEY", ""}});
    CHECK(r.code == 1);
    CHECK(has(r.err, "wants an API key"));
    r = run({exe(), "codex", "--gateway", gw.url(), "--codex", fake_codex()}, {{"FAKE_CODEX_OUT", out.string()}, {"PULSE_GATEWAY_API_KEY", "k3y"}});
    CHECK(r.code == 0);
    std::string argv = pulse::test::read_file(out);
    CHECK(has(argv, "env_key=\"PULSE_GATEWAY_API_KEY\""));
    CHECK_FALSE(has(argv, "k3y"));
    CHECK(pulse::test::read_file(fs::path(out.string() + ".env")) == "PULSE_GATEWAY_API_KEY=k3y\n");
}

TEST_CASE("codex: --start-gateway starts pulse serve when none is running") {
    Site site({"good_cpp", "example_echo"}, "[models.echo]\nprofile = \"test-profile\"\n[[models.echo.endpoints]]\nurl = \"plugin://example-echo\"\n");
    // A fixed free port, so the launcher knows where the gateway will be.
    uint16_t port;
    {
        Poco::Net::ServerSocket s(Poco::Net::SocketAddress("127.0.0.1", 0));
        port = s.address().port();
    }
    std::string text = pulse::test::read_file(site.config);
    std::ofstream(site.config) << "[server]\nlisten = \"127.0.0.1:" << port << "\"\n" << text;
    TempDir tmp;
    auto out = tmp / "argv";
    auto r = run({exe(), "codex", "--config", site.config.string(), "--start-gateway", "--codex", fake_codex()},
                 {{"FAKE_CODEX_OUT", out.string()}, {"XDG_RUNTIME_DIR", tmp.path().string()}, {"PULSE_PLUGIN_DIRS", ""},
                  {"PULSE_GATEWAY_API_KEY", ""}, {"PULSE_QWEN_BACKENDS", ""}});
    CAPTURE(r.err);
    CHECK(r.code == 0);
    std::smatch m;
    REQUIRE(std::regex_search(r.err, m, std::regex(R"(started the gateway \(pid (\d+))")));
    pid_t gw_pid = std::stoi(m[1]);
    CHECK(has(pulse::test::read_file(out), "base_url=\"http://127.0.0.1:" + std::to_string(port) + "/v1\""));
    // The gateway this run started ended with it (drained on SIGTERM and reaped).
    CHECK(has(r.err, "stopped the gateway it started (pid " + std::to_string(gw_pid) + ")"));
    CHECK(::kill(gw_pid, 0) != 0);

    // --keep-gateway leaves it running, and says how to stop it.
    r = run({exe(), "codex", "--config", site.config.string(), "--start-gateway", "--keep-gateway", "--codex", fake_codex()},
            {{"FAKE_CODEX_OUT", out.string()}, {"XDG_RUNTIME_DIR", tmp.path().string()}, {"PULSE_PLUGIN_DIRS", ""},
             {"PULSE_GATEWAY_API_KEY", ""}, {"PULSE_QWEN_BACKENDS", ""}});
    CHECK(r.code == 0);
    REQUIRE(std::regex_search(r.err, m, std::regex(R"(started the gateway \(pid (\d+))")));
    gw_pid = std::stoi(m[1]);
    CHECK(has(r.err, "keeps running after codex exits"));
    CHECK(::kill(gw_pid, 0) == 0);
    ::kill(gw_pid, SIGTERM);
    for (int i = 0; i < 200 && ::kill(gw_pid, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(::kill(gw_pid, 0) != 0);  // it drained and exited
}

TEST_CASE("every command and sub-command answers --help with exit 0") {
    const std::vector<std::vector<std::string>> cmds = {
        {"serve"}, {"plugins"}, {"config"}, {"config", "check"}, {"model"}, {"codex"}, {"continuity"}, {"continuity", "list"},
        {"continuity", "show"}, {"continuity", "clear"}, {"continuity", "prune"}, {"continuity", "hooks-json"}, {"continuity", "hook"}, {"bench"},
        {"bench", "decode"}, {"bench", "accept"}, {"bench", "ttft"}, {"bench", "quality"}, {"bench", "drift"}, {"bench", "agent"},
        {"decode"}, {"gguf"}, {"gguf", "make-demo"}, {"gguf", "info"}, {"distill"}, {"distill", "collect"}, {"distill", "export-head"},
        {"distill", "import-head"}, {"distill", "vocab"}, {"model", "profiles"}, {"model", "render"}, {"model", "up"}, {"model", "down"},
        {"model", "status"}, {"doctor"}};
    for (const auto& c : cmds) {
        std::vector<std::string> argv = {exe()};
        argv.insert(argv.end(), c.begin(), c.end());
        argv.push_back("--help");
        auto r = run(argv, kNoEnvOverrides);
        CAPTURE(c);
        CHECK(r.code == 0);
        CHECK(has(r.out, "usage: pulse " + c[0]));
    }
    // Regression: `pulse doctor` answered --help but the command list left it out. Every command
    // here is listed, at the start of a line of the list.
    auto r = run({exe(), "--help"});
    for (const auto& c : cmds) {
        CAPTURE(c[0]);
        CHECK(has(r.out, "\n  " + c[0] + " "));
    }
    CHECK(has(r.out, "decode|accept|ttft|quality|drift|agent"));
}

TEST_CASE("continuity: prune by age and count, clear --all; a new session prunes states older than 30 days") {
    TempDir tmp;
    std::map<std::string, std::string> env = {{"XDG_STATE_HOME", tmp.path().string()}};
    auto hook = [&](const std::string& input) { return run({"/bin/sh", "-c", "printf '%s' \"$1\" | \"$2\" continuity hook", "sh", input, exe()}, env); };
    auto sid = [](int i) { return "0199aaaa-bbbb-7ccc-8ddd-00000000000" + std::to_string(i); };
    for (int i = 0; i < 4; ++i)
        REQUIRE(hook(R"({"session_id":")" + sid(i) + R"(","hook_event_name":"UserPromptSubmit","cwd":"/p","prompt":"task )" + std::to_string(i) + "\"}").code == 0);
    const fs::path dir = tmp / "pulse-gateway" / "continuity";
    auto age = [&](int i, std::chrono::hours h) { fs::last_write_time(dir / (sid(i) + ".json"), fs::file_time_type::clock::now() - h); };
    age(0, std::chrono::hours(24 * 40));  // untouched for 40 days
    age(1, std::chrono::hours(24 * 10));
    age(2, std::chrono::hours(24 * 2));
    auto sessions = [&] { return lines_of(run({exe(), "continuity", "list"}, env).out).size(); };
    REQUIRE(sessions() == 4);
    // A session starting lets go of states past the 30-day bound.
    REQUIRE(hook(R"({"session_id":")" + sid(3) + R"(","hook_event_name":"SessionStart","cwd":"/p","source":"startup"})").code == 0);
    CHECK(sessions() == 3);
    CHECK_FALSE(fs::exists(dir / (sid(0) + ".json")));
    auto r = run({exe(), "continuity", "prune", "--older-than", "7d"}, env);
    CHECK(r.code == 0);
    CHECK(has(r.out, "pruned 1 sessions"));
    CHECK(sessions() == 2);
    r = run({exe(), "continuity", "prune", "--older-than", "1000d", "--keep", "1"}, env);
    CHECK(has(r.out, "pruned 1 sessions"));
    CHECK(run({exe(), "continuity", "show", sid(3)}, env).code == 0);  // the newest stays
    CHECK(run({exe(), "continuity", "prune", "--older-than", "soon"}, env).code == 2);
    CHECK(run({exe(), "continuity", "prune"}, env).code == 2);
    r = run({exe(), "continuity", "clear", "--all"}, env);
    CHECK(r.code == 0);
    CHECK(has(r.out, "cleared 1 sessions"));
    CHECK(sessions() == 0);
}

TEST_CASE("codex: without --config it finds the config as pulse serve does (the user's ~/.config/pulse-gateway/pulse.toml)") {
    TempDir tmp;
    // The place before 0.1 (~/.config/pulse, PulseAudio's directory) is still read...
    fs::create_directories(tmp / "xdg" / "pulse");
    std::ofstream(tmp / "xdg" / "pulse" / "pulse.toml") << "[server]\nlisten = \"127.0.0.1:1\"\n";
    auto r = run({exe(), "codex", "--codex", fake_codex()},
                 {{"FAKE_CODEX_OUT", (tmp / "argv").string()}, {"PULSE_CONFIG", ""}, {"XDG_CONFIG_HOME", (tmp / "xdg").string()}});
    CHECK(r.code == 1);
    CHECK(has(r.err, "no Pulse gateway at http://127.0.0.1:1 "));
    CHECK(has(r.err, "pulse serve --config " + (tmp / "xdg" / "pulse" / "pulse.toml").string()));
    // ...after ~/.config/pulse-gateway.
    fs::create_directories(tmp / "xdg" / "pulse-gateway");
    std::ofstream(tmp / "xdg" / "pulse-gateway" / "pulse.toml") << "[server]\nlisten = \"127.0.0.1:2\"\n";
    r = run({exe(), "codex", "--codex", fake_codex()},
            {{"FAKE_CODEX_OUT", (tmp / "argv").string()}, {"PULSE_CONFIG", ""}, {"XDG_CONFIG_HOME", (tmp / "xdg").string()}});
    CHECK(has(r.err, "pulse serve --config " + (tmp / "xdg" / "pulse-gateway" / "pulse.toml").string()));
}

TEST_CASE("codex: an exec run that cannot write is warned about; one with --full-auto or a writable sandbox is not") {
    EchoGateway gw;
    TempDir tmp;
    auto out = tmp / "argv";
    auto go = [&](std::vector<std::string> extra) {
        std::vector<std::string> argv = {exe(), "codex", "--gateway", gw.url(), "--codex", fake_codex(), "--no-continuity", "--"};
        argv.insert(argv.end(), extra.begin(), extra.end());
        return run(argv, {{"FAKE_CODEX_OUT", out.string()}, {"PULSE_GATEWAY_API_KEY", ""}});
    };
    CHECK(has(go({"exec", "fix the failing test"}).err, "`codex exec` runs read-only"));
    CHECK(has(go({"exec", "-m", "x", "fix it"}).err, "runs read-only"));
    for (const auto& ok : std::vector<std::vector<std::string>>{{"exec", "--full-auto", "fix it"},
                                                                {"exec", "--sandbox", "workspace-write", "fix it"},
                                                                {"exec", "-s", "danger-full-access", "fix it"},
                                                                {"exec", "--dangerously-bypass-approvals-and-sandbox", "fix it"},
                                                                {"-c", "sandbox_mode=\"workspace-write\"", "exec", "fix it"},
                                                                {"fix it interactively"}}) {
        CAPTURE(ok);
        auto r = go(ok);
        CHECK(r.code == 0);
        CHECK_FALSE(has(r.err, "read-only"));
    }
}

TEST_CASE("codex: each run has its own catalog file, removed when codex exits") {
    EchoGateway gw;
    TempDir tmp;
    std::vector<std::string> catalogs;
    for (int i = 0; i < 2; ++i) {
        auto out = tmp / ("argv" + std::to_string(i));
        auto r = run({exe(), "codex", "--gateway", gw.url(), "--codex", fake_codex(), "--no-continuity"},
                     {{"FAKE_CODEX_OUT", out.string()}, {"PULSE_GATEWAY_API_KEY", ""}, {"XDG_RUNTIME_DIR", tmp.path().string()}});
        REQUIRE(r.code == 0);
        for (const auto& a : lines_of(pulse::test::read_file(out)))
            if (a.rfind("model_catalog_json=", 0) == 0) catalogs.push_back(a.substr(20, a.size() - 21));
        REQUIRE(fs::exists(out.string() + ".catalog"));  // codex saw it
    }
    REQUIRE(catalogs.size() == 2);
    CHECK(catalogs[0] != catalogs[1]);
    CHECK_FALSE(fs::exists(catalogs[0]));
    CHECK_FALSE(fs::exists(catalogs[1]));
}
