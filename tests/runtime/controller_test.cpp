// The runtime controller (`pulse model`) against a fake recipe: start.sh/stop.sh that run
// fake_vllm on loopback and write vLLM-style log lines, a fake /proc/meminfo, and a fake ssh on
// PATH. Every step and every failure path, with what is (and is not) written.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/file.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "catalog.h"
#include "controller.h"
#include "env_file.h"
#include "node_scripts.h"
#include "nodes.h"
#include "support/temp_dir.h"
#include "transport.h"

namespace fs = std::filesystem;
using namespace pulse::runtime;
using pulse::test::TempDir;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

size_t count(const std::string& hay, const std::string& needle) {
    size_t n = 0;
    for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
    return n;
}

// Every file under `dir` with its content, for "nothing was written" checks.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
    std::map<std::string, std::string> m;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(dir, ec))
        if (e.is_regular_file()) m[e.path().string()] = slurp(e.path());
    return m;
}

// A site: the shipped qwen38 profiles (port changed to a free one), a fake recipe, state and
// fragment dirs, a nodes file with a local node, an ssh node and an unreachable one.
struct Site {
    TempDir tmp;
    fs::path recipe = tmp / "recipe", state = tmp / "state", fragments = tmp / "endpoints.d", profiles = tmp / "profiles",
             nodes = tmp / "nodes.toml", meminfo = tmp / "meminfo", shard = tmp / "mtp-head.safetensors";
    int port = free_port();
    std::string out;
    std::string gateway_url = "http://127.0.0.1:1";  // nothing listens: reload reports "not reachable"

    explicit Site(const std::string& variant = "ok") {
        fs::copy(fs::path(PULSE_SOURCE_ROOT) / "tests/runtime/fake_recipe", recipe, fs::copy_options::recursive);
        fs::create_directories(profiles);
        fs::copy(fs::path(PULSE_SOURCE_ROOT) / "profiles/qwen38", profiles / "qwen38", fs::copy_options::recursive);
        for (const auto& e : fs::directory_iterator(profiles / "qwen38")) {
            if (e.path().extension() != ".env") continue;
            std::string t = slurp(e.path());
            t = std::regex_replace(t, std::regex("PORT='8888'"), "PORT='" + std::to_string(port) + "'");
            std::ofstream(e.path()) << t;
        }
        set_variant(variant);
        tmp.write("meminfo", "MemTotal:       127600000 kB\nMemAvailable:   120000000 kB\n");
        tmp.write("mtp-head.safetensors", "weights");
        write_nodes("");
    }
    ~Site() {
        // Whatever a test left running goes down with it.
        std::string cmd = "cd '" + recipe.string() + "' && FAKE_VARIANT=ok ./stop.sh >/dev/null 2>&1";
        if (fs::exists(recipe / "fake-vllm.pid")) {
            set_variant("ok");
            int rc = std::system(cmd.c_str());
            (void)rc;
        }
    }
    void set_variant(const std::string& v) {
        std::ofstream(recipe / "fake.conf") << "FAKE_VLLM='" << std::getenv("PULSE_FAKE_VLLM") << "'\nFAKE_VARIANT='" << v
                                            << "'\nFAKE_MEMINFO='" << meminfo.string() << "'\n";
    }
    void write_nodes(const std::string& extra_local) {
        std::string common = "recipe_dir = \"" + recipe.string() + "\"\nhost = \"127.0.0.1\"\nmeminfo = \"" + meminfo.string() +
                             "\"\npoll_interval_s = 0.05\nmemory_timeout_s = 1\nready_timeout_s = 5\nstop_timeout_s = 20\n"
                             "gpu_apps_command = \"cat fake-gpu-apps 2>/dev/null || true\"\n"
                             "own_pids_command = \"cat fake-vllm.pid 2>/dev/null\"\n"
                             "log_command = \"cat fake-vllm.log\"\n"
                             "gateway_url = \"" + gateway_url + "\"\n";
        std::string paths = "mtp_head_shard = \"" + shard.string() + "\"\n";
        std::ofstream(nodes) << "[defaults]\nmemory_threshold_gib = 100\n\n[nodes.test]\nssh = \"local\"\n" << common << extra_local
                             << "[nodes.test.paths]\n" << paths << "\n[nodes.remote]\nssh = \"ops@spark1\"\nssh_options = [\"-p\", \"2222\"]\n"
                             << common << "[nodes.remote.paths]\n" << paths << "\n[nodes.unreachable]\nssh = \"unreachable\"\n"
                             << common;
    }
    Settings settings() const {
        Settings s;
        s.nodes_file = nodes;
        s.profiles_dir = profiles;
        s.state_dir = state;
        s.gateway = {gateway_url, fragments.string(), ""};
        return s;
    }
    int run(std::vector<std::string> args) {
        out.clear();
        Controller c(settings(), [this](std::string_view t) { out.append(t); });
        return c.command(args);
    }
    bool server_answers() const {
        std::string cmd = "curl -sf -m 2 http://127.0.0.1:" + std::to_string(port) + "/v1/models >/dev/null 2>&1";
        return std::system(cmd.c_str()) == 0;
    }
    std::string env() const { return slurp(recipe / ".env"); }
    std::vector<fs::path> backups() const {
        std::vector<fs::path> b;
        for (const auto& e : fs::directory_iterator(recipe))
            if (e.path().filename().string().rfind(".env.pulse-backup-", 0) == 0) b.push_back(e.path());
        return b;
    }
};

// bash reads a rendered .env back: KEY=VALUE lines, values byte for byte.
std::map<std::string, std::string> source_with_bash(const fs::path& env_file) {
    RunResult r = run_process({"bash", "-c", "set -a; . \"$1\"; set +a; env -0", "bash", env_file.string()}, "", 10);
    std::map<std::string, std::string> m;
    size_t pos = 0;
    while (pos < r.output.size()) {
        size_t end = r.output.find('\0', pos);
        std::string kv = r.output.substr(pos, end - pos);
        auto eq = kv.find('=');
        if (eq != std::string::npos) m[kv.substr(0, eq)] = kv.substr(eq + 1);
        pos = end == std::string::npos ? r.output.size() : end + 1;
    }
    return m;
}

}  // namespace

// ---- env files -------------------------------------------------------------------------------

TEST_CASE("env: quotes, export, comments and metadata parse as bash reads them") {
    auto f = parse_env("# header line\n#@ description: d\n#@ proof: a\n#@ proof: b\nexport A='x y'\nB=\"q\\\"z\"\nC=plain # c\nD=\nE='it'\\''s'\n",
                       "t.env");
    REQUIRE(f.entries.size() == 5);
    CHECK(f.find("A")->value == "x y");
    CHECK(f.find("B")->value == "q\"z");
    CHECK(f.find("C")->value == "plain");
    CHECK(f.find("D")->value.empty());
    CHECK(f.find("E")->value == "it's");
    CHECK(f.header == std::vector<std::string>{"header line"});
    CHECK(f.meta_all("proof") == std::vector<std::string>{"a", "b"});
}

TEST_CASE("env: expansions, duplicate keys and bad syntax are errors naming the line") {
    CHECK_THROWS_WITH_AS(parse_env("A=1\nB=$HOME\n", "p.env"), doctest::Contains("p.env:2: B: '$' would be expanded"), EnvError);
    CHECK_THROWS_WITH_AS(parse_env("A=\"$(id)\"\n", "p.env"), doctest::Contains("p.env:1: A: '$'"), EnvError);
    CHECK_THROWS_WITH_AS(parse_env("A=1\nA=2\n", "p.env"), doctest::Contains("p.env:2: A is set twice"), EnvError);
    CHECK_THROWS_WITH_AS(parse_env("A='open\n", "p.env"), doctest::Contains("p.env:1: A: unterminated single quote"), EnvError);
    CHECK_THROWS_WITH_AS(parse_env("A=a b\n", "p.env"), doctest::Contains("unquoted space"), EnvError);
    CHECK_THROWS_WITH_AS(parse_env("1A=x\n", "p.env"), doctest::Contains("not a valid variable name"), EnvError);
    CHECK_THROWS_WITH_AS(parse_env("just words\n", "p.env"), doctest::Contains("p.env:1: expected KEY=value"), EnvError);
}

TEST_CASE("env: shell_quote survives bash for every awkward byte") {
    TempDir t;
    std::string nasty = "a'b\"c $HOME `id` \\ ; | & * ? [x] {y} ~ !x #z";
    auto p = t.write("x.env", "V=" + shell_quote(nasty) + "\n");
    CHECK(source_with_bash(p)["V"] == nasty);
    CHECK(parse_env(slurp(p), "x.env").find("V")->value == nasty);
}

TEST_CASE("env: sample keys include commented-out optional keys, not prose") {
    auto keys = sample_keys("# Copy to .env\nIMAGE=x\n#HF_TOKEN=\n# set PORT=1 for ...\nexport PORT=8888\nlower=1\n");
    CHECK(keys == std::vector<std::string>{"IMAGE", "HF_TOKEN", "PORT"});
}

// ---- profiles ----------------------------------------------------------------------------------

TEST_CASE("node scripts: a models probe's answer is read from its marked-up output") {
    auto up = scripts::read_probe("HTTP 200\nBODY_BEGIN\n{\"data\":[]}\nBODY_END\n");
    CHECK(up.code == "200");
    CHECK(up.body == "{\"data\":[]}\n");
    CHECK(up.start_exit.empty());
    // Not listening yet, the start command failed: its exit and its last lines, indented.
    auto down = scripts::read_probe("HTTP 000\nSTART_EXIT 3\nLOG boom\nLOG bye\r\n");
    CHECK(down.code == "000");
    CHECK(down.body.empty());
    CHECK(down.start_exit == "3");
    CHECK(down.log_tail == "        boom\n        bye\n");
    CHECK(scripts::read_probe("curl: not found\n").code.empty());
}

TEST_CASE("profiles: the shipped qwen38 profiles load, validate and say what they are") {
    auto cat = Catalog::load(fs::path(PULSE_SOURCE_ROOT) / "profiles");
    const Profile& best = cat.find("best");
    CHECK(best.qualified() == "qwen38/best");
    CHECK(best.value("MTP_NUM_SPECULATIVE_TOKENS") == "6");
    CHECK(best.value("MAX_NUM_SEQS") == "4");
    CHECK(best.value("EXTRA_DOCKER_ARGS").find("{{mtp_head_shard}}") != std::string::npos);
    std::string header;
    for (const auto& h : best.env.header) header += h + "\n";
    CHECK(header.find("64.4") != std::string::npos);
    CHECK(header.find("60.0") != std::string::npos);
    CHECK(cat.find("qwen38/datagen").render_only.empty());
    CHECK(cat.find("capture").value("MTP_NUM_SPECULATIVE_TOKENS") == "0");
    CHECK_FALSE(cat.find("tp2").render_only.empty());
    // The three startable profiles are complete key sets for the recipe (.env.sample keys).
    auto sample = sample_keys(slurp(fs::path(PULSE_SOURCE_ROOT) / "tests/runtime/fake_recipe/.env.sample"));
    for (const char* n : {"best", "datagen", "capture"})
        for (const auto& k : sample) CHECK_MESSAGE(cat.find(n).env.find(k), n << " lacks " << k);
}

struct ProfileDir {
    TempDir t;
    ProfileDir(const std::string& profile_text) {
        fs::create_directories(t / "profiles/fam");
        fs::copy_file(fs::path(PULSE_SOURCE_ROOT) / "profiles/qwen38/runtime.toml", t / "profiles/fam/runtime.toml");
        t.write("profiles/fam/p.env", profile_text);
    }
    std::string error() {
        try {
            Catalog::load(t / "profiles");
        } catch (const CatalogError& e) {
            return e.what();
        }
        return "";
    }
};

std::string good_profile() { return slurp(fs::path(PULSE_SOURCE_ROOT) / "profiles/qwen38/datagen.env"); }

TEST_CASE("profiles: an unknown key is an error naming the file, line and key") {
    ProfileDir d(good_profile() + "MAX_NUM_SEQ='4'\n");
    std::string e = d.error();
    CHECK(e.find("p.env:") != std::string::npos);
    CHECK(e.find("unknown key MAX_NUM_SEQ for runtime family fam") != std::string::npos);
}

TEST_CASE("profiles: values out of range or of the wrong type name the key and what is allowed") {
    std::string t = std::regex_replace(good_profile(), std::regex("MAX_NUM_SEQS='8'"), "MAX_NUM_SEQS='0'");
    t = std::regex_replace(t, std::regex("KV_CACHE_DTYPE='fp8'"), "KV_CACHE_DTYPE='fp4'");
    t = std::regex_replace(t, std::regex("PORT='8888'"), "PORT='http'");
    ProfileDir d(t);
    std::string e = d.error();
    CHECK(e.find("MAX_NUM_SEQS = 0 is out of range; allowed 1 to 256") != std::string::npos);
    CHECK(e.find("KV_CACHE_DTYPE 'fp4' is not one of auto, fp8") != std::string::npos);
    CHECK(e.find("PORT 'http' is not an integer") != std::string::npos);
}

TEST_CASE("profiles: a missing required key, a missing description and a bad proof are errors") {
    std::string t = std::regex_replace(good_profile(), std::regex("PORT='8888'\n"), "");
    t = std::regex_replace(t, std::regex("#@ description:[^\n]*\n"), "");
    t += "#@ proof: (unclosed\n#@ proof: x=${NOT_SET}\n#@ colour: red\n";
    ProfileDir d(t);
    std::string e = d.error();
    CHECK(e.find("required key PORT is missing") != std::string::npos);
    CHECK(e.find("'#@ description: ...' is required") != std::string::npos);
    CHECK(e.find("proof '(unclosed' is not a valid regex") != std::string::npos);
    CHECK(e.find("names ${NOT_SET}") != std::string::npos);
    CHECK(e.find("unknown metadata '#@ colour:'") != std::string::npos);
}

TEST_CASE("profiles: a runtime.toml with an unknown field or a missing schema is rejected") {
    TempDir t;
    t.write("profiles/fam/runtime.toml", "description = 'x'\nserved_model_key = 'A'\nlog_command = 'cat log'\n"
                                         "kv_cache_pattern = 'KV (\\d+)'\n[keys.A]\ntype = 'string'\ncolour = 'red'\n"
                                         "[keys.B]\ntype = 'int'\nmin = '5'\n");
    t.write("profiles/bad/runtime.toml", "description = 'x'\n");
    std::string e;
    try {
        Catalog::load(t / "profiles");
    } catch (const CatalogError& x) {
        e = x.what();
    }
    CHECK(e.find("fam/runtime.toml:7:1: unknown key 'keys.A.colour'; allowed here: type, required, sample, min, max, doc, choices") !=
          std::string::npos);
    // Regression: a field of the wrong type was ignored (min = '5' set no minimum).
    CHECK(e.find("fam/runtime.toml:10:7: 'keys.B.min' must be an integer, found a string") != std::string::npos);
    CHECK(e.find("bad/runtime.toml: 'served_model_key' is required") != std::string::npos);
    CHECK(e.find("[keys.NAME] tables are required") != std::string::npos);
}

TEST_CASE("profiles: find names the available profiles and refuses ambiguity") {
    TempDir t;
    for (const char* fam : {"a", "b"}) {
        fs::create_directories(t / "profiles" / fam);
        fs::copy_file(fs::path(PULSE_SOURCE_ROOT) / "profiles/qwen38/runtime.toml", t / "profiles" / fam / "runtime.toml");
        t.write(std::string("profiles/") + fam + "/same.env", good_profile());
    }
    auto cat = Catalog::load(t / "profiles");
    CHECK_THROWS_WITH_AS(cat.find("same"), doctest::Contains("ambiguous: a/same and b/same"), CatalogError);
    CHECK(cat.find("b/same").family->name == "b");
    CHECK_THROWS_WITH_AS(cat.find("nope"), doctest::Contains("available: a/same, b/same"), CatalogError);
}

TEST_CASE("profiles: render fills site paths and reports the ones it cannot") {
    auto cat = Catalog::load(fs::path(PULSE_SOURCE_ROOT) / "profiles");
    Rendered r = render(cat.find("best"), {{"mtp_head_shard", "/srv/mtp.st"}}, "test");
    CHECK(r.get("EXTRA_DOCKER_ARGS") == "-v /srv/mtp.st:/opt/pulse/mtp-head.safetensors:ro");
    CHECK(r.unresolved.empty());
    Rendered u = render(cat.find("best"), {}, "test");
    CHECK(u.unresolved == std::vector<std::string>{"EXTRA_DOCKER_ARGS: {{mtp_head_shard}}"});
}

// ---- nodes -------------------------------------------------------------------------------------

TEST_CASE("nodes: defaults apply, a node overrides them") {
    TempDir t;
    auto p = t.write("n.toml", "[defaults]\nmemory_threshold_gib = 90\npoll_interval_s = 2\n[nodes.a]\nrecipe_dir = \"/r\"\n"
                               "[nodes.b]\nrecipe_dir = \"/r\"\nssh = \"ops@b\"\nmemory_threshold_gib = 110\n[nodes.b.paths]\nx = \"/p\"\n");
    auto n = load_nodes(p);
    CHECK(n.find("a").memory_threshold_gib == 90);
    CHECK(n.find("a").local());
    CHECK(n.find("b").memory_threshold_gib == 110);
    CHECK(n.find("b").poll_interval_s == 2);
    CHECK(n.find("b").paths.at("x") == "/p");
    CHECK_THROWS_WITH_AS(n.find("c"), doctest::Contains("no node 'c'; defined: a, b"), NodesError);
}

TEST_CASE("nodes: unknown keys, a missing recipe_dir, relative paths and a missing file are clear errors") {
    TempDir t;
    auto p = t.write("n.toml", "[nodes.a]\nrecipe = \"/r\"\n[nodes.b]\nrecipe_dir = \"r\"\n[nodes.c]\nrecipe_dir = \"/r\"\n[nodes.c.paths]\nx = \"rel\"\n");
    std::string e;
    try {
        load_nodes(p);
    } catch (const NodesError& x) {
        e = x.what();
    }
    // The config's format: FILE:LINE:COLUMN, the key with its table, what is wrong, what is allowed.
    CHECK(e.find("n.toml:2:1: unknown key 'nodes.a.recipe'; allowed here: ssh, ") != std::string::npos);
    CHECK(e.find("'nodes.a.recipe_dir' is required") != std::string::npos);
    CHECK(e.find("'nodes.b.recipe_dir' is required") != std::string::npos);
    CHECK(e.find("n.toml:8:5: 'nodes.c.paths.x' must be an absolute path") != std::string::npos);
    // A value of the wrong type is named with what it is.
    auto typed = t.write("typed.toml", "[nodes.a]\nrecipe_dir = \"/r\"\npoll_interval_s = \"fast\"\nssh_options = [\"-p\", 2222]\n");
    e.clear();
    try {
        load_nodes(typed);
    } catch (const NodesError& x) {
        e = x.what();
    }
    CHECK(e.find("typed.toml:3:19: 'nodes.a.poll_interval_s' must be a number, found a string") != std::string::npos);
    CHECK(e.find("typed.toml:4:22: 'nodes.a.ssh_options' must contain only strings, found an integer") != std::string::npos);
    CHECK_THROWS_WITH_AS(load_nodes(t / "missing.toml"), doctest::Contains("file not found"), NodesError);
}

// ---- commands: profiles, render ----------------------------------------------------------------

TEST_CASE("profiles command: one line each, render-only marked") {
    Site s;
    REQUIRE(s.run({"profiles"}) == kOk);
    CHECK(s.out.find("qwen38/best") != std::string::npos);
    CHECK(s.out.find("qwen38/tp2") != std::string::npos);
    CHECK(s.out.find("[render only]") != std::string::npos);
    CHECK(count(s.out, "\n") == 5);  // header + 4 profiles
}

TEST_CASE("render: the output is an .env bash sources back to the profile's values") {
    Site s;
    REQUIRE(s.run({"render", "best", "--node", "test"}) == kOk);
    TempDir t;
    auto p = t.write("rendered.env", s.out);
    auto vars = source_with_bash(p);
    CHECK(vars["MTP_NUM_SPECULATIVE_TOKENS"] == "6");
    CHECK(vars["EXTRA_DOCKER_ARGS"] == "-v " + s.shard.string() + ":/opt/pulse/mtp-head.safetensors:ro");
    CHECK(vars["HF_TOKEN"].empty());
    CHECK(s.out.find("64.4") != std::string::npos);  // the header travels with it
}

TEST_CASE("render: without --node site paths stay visible; a node lacking one is an error") {
    Site s;
    REQUIRE(s.run({"render", "best"}) == kOk);
    CHECK(s.out.find("# NOTE: site paths not filled in") == 0);
    CHECK(s.out.find("{{mtp_head_shard}}") != std::string::npos);
    CHECK(s.run({"render", "qwen38/tp2", "--node", "test"}) == kBadConfig);
    CHECK(s.out.find("no [paths] entry for TP_HEAD_NODE: {{tp_head_ip}}") != std::string::npos);
}

TEST_CASE("usage errors: unknown command, option, missing --node, render-only and unknown profiles") {
    Site s;
    CHECK(s.run({"launch"}) == kUsage);
    CHECK(s.out.find("pulse model: The following argument was not expected: launch") != std::string::npos);
    CHECK(s.run({"up", "best", "--nod", "test"}) == kUsage);
    CHECK(s.run({"up", "best"}) == kUsage);
    CHECK(s.run({"up", "tp2", "--node", "test"}) == kUsage);
    CHECK(s.out.find("render-only") != std::string::npos);
    CHECK(s.run({"up", "fastest", "--node", "test"}) == kUsage);
    CHECK(s.out.find("available: qwen38/best") != std::string::npos);
    CHECK(s.run({"up", "best", "--node", "nowhere"}) == kBadConfig);
    CHECK(s.out.find("no node 'nowhere'") != std::string::npos);
    CHECK(s.run({"status", "--node", "test", "--dry-run"}) == kUsage);
    CHECK_FALSE(fs::exists(s.recipe / "calls.log"));
}

// ---- up ------------------------------------------------------------------------------------------

TEST_CASE("up: brings the fake server up, verifies it and publishes it") {
    Site s;
    REQUIRE(s.run({"up", "best", "--node", "test"}) == kOk);
    INFO(s.out);
    for (int i = 1; i <= 6; ++i) CHECK(s.out.find("[" + std::to_string(i) + "/6]") != std::string::npos);
    CHECK(count(s.out, "      ok (") == 6);
    CHECK(s.server_answers());
    // The .env is exactly the rendered profile.
    auto vars = source_with_bash(s.recipe / ".env");
    CHECK(vars["MTP_NUM_SPECULATIVE_TOKENS"] == "6");
    CHECK(vars["PORT"] == std::to_string(s.port));
    CHECK((fs::status(s.recipe / ".env").permissions() & fs::perms::others_read) == fs::perms::none);
    // Verification saw the proof lines.
    CHECK(s.out.find("proof: num_spec_tokens=6") != std::string::npos);
    CHECK(s.out.find("proof: 'max_num_seqs': 4") != std::string::npos);
    CHECK(s.out.find("KV cache: GPU KV cache size: 1,048,576 tokens") != std::string::npos);
    // Node state, fragment, run log.
    std::string state = slurp(s.state / "nodes/test.json");
    CHECK(state.find("\"status\": \"up\"") != std::string::npos);
    CHECK(state.find("\"profile\": \"qwen38/best\"") != std::string::npos);
    CHECK(state.find("\"kv_cache_tokens\": \"1048576\"") != std::string::npos);
    std::string frag = slurp(s.fragments / "test.toml");
    CHECK(frag.find("upstream_model = \"qwen3.8-flash-next\"") != std::string::npos);
    CHECK(frag.find("url = \"http://127.0.0.1:" + std::to_string(s.port) + "/v1\"") != std::string::npos);
    std::string log = slurp(s.state / "logs/test.log");
    CHECK(log.find("--- preflight via bash -s") != std::string::npos);
    CHECK(log.find("--- start via") != std::string::npos);
    CHECK(s.out.find("gateway at http://127.0.0.1:1 not reachable") != std::string::npos);
}

TEST_CASE("up: the previous .env is kept as a timestamped backup") {
    Site s;
    std::ofstream(s.recipe / ".env") << "# hand-written\nPORT=1\n";
    REQUIRE(s.run({"up", "capture", "--node", "test"}) == kOk);
    auto b = s.backups();
    REQUIRE(b.size() == 1);
    CHECK(slurp(b[0]) == "# hand-written\nPORT=1\n");
    CHECK(std::regex_search(b[0].filename().string(), std::regex(R"(^\.env\.pulse-backup-\d{8}T\d{6}Z$)")));
    CHECK(s.out.find("previous .env kept as") != std::string::npos);
}

TEST_CASE("up: switching profiles stops the running server first (its own GPU process is allowed)") {
    Site s;
    REQUIRE(s.run({"up", "capture", "--node", "test"}) == kOk);
    REQUIRE(s.run({"up", "best", "--node", "test"}) == kOk);
    INFO(s.out);
    CHECK(s.out.find("belongs to this recipe's server") != std::string::npos);
    std::string calls = slurp(s.recipe / "calls.log");
    CHECK(count(calls, "start ") == 2);
    CHECK(count(calls, "stop ") == 2);
    CHECK(calls.rfind("stop ") < calls.rfind("start "));
    CHECK(slurp(s.state / "nodes/test.json").find("\"profile\": \"qwen38/best\"") != std::string::npos);
}

TEST_CASE("up --dry-run prints the .env and every step's script, runs nothing and writes nothing") {
    Site s;
    auto before = snapshot(s.tmp.path());
    REQUIRE(s.run({"up", "best", "--node", "test", "--dry-run"}) == kOk);
    CHECK(snapshot(s.tmp.path()) == before);
    CHECK_FALSE(fs::exists(s.state));
    CHECK(s.out.find("DRY RUN") == 0);
    CHECK(s.out.find("MTP_NUM_SPECULATIVE_TOKENS='6'") != std::string::npos);
    for (const char* step : {"step 1/6 preflight", "step 2/6 stop", "step 3/6 write", "step 4/6 start", "step 5/6 verify", "step 6/6 publish"})
        CHECK_MESSAGE(s.out.find(step) != std::string::npos, step);
    CHECK(s.out.find("./stop.sh") != std::string::npos);
    CHECK(s.out.find("nohup setsid bash -c './start.sh; echo $? > .pulse-start.rc'") != std::string::npos);
    CHECK(s.out.find("/v1/models") != std::string::npos);
    CHECK(s.out.find("MemAvailable") != std::string::npos);
    CHECK_FALSE(s.server_answers());
}

TEST_CASE("up: a second up on a locked node is refused and touches nothing") {
    Site s;
    fs::create_directories(s.state / "locks");
    int fd = ::open((s.state / "locks/test.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    std::string holder = "pid 4242 since 2026-11-29T10:00:00Z\n";
    REQUIRE(::write(fd, holder.data(), holder.size()) == static_cast<ssize_t>(holder.size()));
    REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    CHECK(s.run({"up", "best", "--node", "test"}) == kLocked);
    CHECK(s.out.find("locked by another `pulse model` command (held by pid 4242") != std::string::npos);
    CHECK(s.run({"down", "--node", "test"}) == kLocked);
    CHECK_FALSE(fs::exists(s.recipe / "calls.log"));
    ::close(fd);
    CHECK(s.run({"up", "capture", "--node", "test"}) == kOk);  // released: it works again
}

// ---- preflight failures (nothing changes on the node) --------------------------------------------

TEST_CASE("preflight: a missing recipe directory stops before anything runs") {
    Site s;
    std::string saved = s.recipe.string() + ".moved";
    fs::rename(s.recipe, saved);
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("recipe directory " + s.recipe.string() + " is missing or not accessible") != std::string::npos);
    fs::rename(saved, s.recipe);
    CHECK_FALSE(fs::exists(s.recipe / "calls.log"));
}

TEST_CASE("preflight: a start.sh that is not executable fails the step") {
    Site s;
    fs::permissions(s.recipe / "start.sh", fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::remove);
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("./start.sh is missing or not executable") != std::string::npos);
    CHECK_FALSE(fs::exists(s.recipe / ".env"));
}

TEST_CASE("preflight: keys the recipe's .env.sample has and the profile lacks are listed") {
    Site s;
    std::ofstream(s.recipe / ".env.sample", std::ios::app) << "NEW_RECIPE_KEY=1\n#OTHER_NEW=\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("missing from " + (s.profiles / "qwen38/best.env").string() + ": NEW_RECIPE_KEY, OTHER_NEW") != std::string::npos);
    CHECK_FALSE(fs::exists(s.recipe / "calls.log"));
}

TEST_CASE("preflight: profile keys an older recipe's .env.sample does not know are listed") {
    Site s;
    std::string sample = slurp(s.recipe / ".env.sample");
    sample = std::regex_replace(sample, std::regex("MTP_K_SCHEDULE=\n|MTP_DRAFT_VOCAB=\n"), "");
    std::ofstream(s.recipe / ".env.sample") << sample;
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("that the recipe's .env.sample does not have: MTP_K_SCHEDULE, MTP_DRAFT_VOCAB") != std::string::npos);
}

TEST_CASE("preflight: without .env.sample completeness is reported as unchecked, not failed") {
    Site s;
    fs::remove(s.recipe / ".env.sample");
    CHECK(s.run({"up", "capture", "--node", "test"}) == kOk);
    CHECK(s.out.find("no .env.sample in the recipe: key completeness not checked") != std::string::npos);
}

TEST_CASE("preflight: a site path the profile mounts must exist on the node") {
    Site s;
    fs::remove(s.shard);
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("path paths.mtp_head_shard=" + s.shard.string() + " does not exist on the node") != std::string::npos);
}

TEST_CASE("preflight: another GPU server fails it; the recipe's own server does not") {
    Site s;
    std::ofstream(s.recipe / "fake-gpu-apps") << "31337, /usr/bin/llama-server\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("another process is using the GPU: 31337, /usr/bin/llama-server") != std::string::npos);
    CHECK_FALSE(fs::exists(s.recipe / "calls.log"));
}

// ---- stop / memory failures ------------------------------------------------------------------------

TEST_CASE("stop: memory that is never freed fails step 2 with the last reading; the .env is unchanged") {
    Site s("memory_never_freed");
    s.tmp.write("meminfo", "MemTotal: 127600000 kB\nMemAvailable:   62914560 kB\n");
    std::ofstream(s.recipe / ".env") << "OLD=1\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("waiting for memory:") != std::string::npos);
    CHECK(s.out.find("MemAvailable stayed below 100.0 GiB for 1 s (last 60.0 GiB)") != std::string::npos);
    CHECK(s.env() == "OLD=1\n");
    CHECK(s.backups().empty());
}

TEST_CASE("stop: an unreadable meminfo fails step 2") {
    Site s("memory_never_freed");  // this variant's stop.sh leaves the (missing) file alone
    fs::remove(s.meminfo);
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("cannot read MemAvailable from " + s.meminfo.string()) != std::string::npos);
}

TEST_CASE("stop: a failing stop script fails step 2 and nothing else runs") {
    Site s("stop_fails");
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("stop: Error response from daemon") != std::string::npos);
    CHECK(s.out.find("stop script: exit 1; the .env is unchanged") != std::string::npos);
    CHECK_FALSE(fs::exists(s.recipe / ".env"));
}

// ---- start / verify failures roll back -------------------------------------------------------------

void check_rolled_back(Site& s, const std::string& old_env) {
    INFO(s.out);
    CHECK(s.out.find("rolling back:") != std::string::npos);
    CHECK(s.env() == old_env);
    CHECK(s.out.find("restored " + s.recipe.string() + "/.env from .env.pulse-backup-") != std::string::npos);
    CHECK_FALSE(s.server_answers());
    CHECK_FALSE(fs::exists(s.fragments / "test.toml"));
    CHECK(slurp(s.state / "nodes/test.json").find("\"status\": \"failed\"") != std::string::npos);
}

TEST_CASE("start: a start script that fails is reported with its last lines and rolled back") {
    Site s("start_fails");
    std::ofstream(s.recipe / ".env") << "OLD=1\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("start script exited with 1") != std::string::npos);
    CHECK(s.out.find("ValueError: No available memory for the cache blocks") != std::string::npos);
    check_rolled_back(s, "OLD=1\n");
}

TEST_CASE("start: a server that never answers times out and is rolled back") {
    Site s("never_ready");
    std::ofstream(s.recipe / ".env") << "OLD=1\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("waiting for the server:") != std::string::npos);
    CHECK(s.out.find("/v1/models did not answer 200 within 5 s") != std::string::npos);
    check_rolled_back(s, "OLD=1\n");
}

TEST_CASE("verify: a server with the wrong model name fails and is rolled back") {
    Site s("wrong_model");
    std::ofstream(s.recipe / ".env") << "OLD=1\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("served model: expected 'qwen3.8-flash-next', /v1/models lists some-other-model") != std::string::npos);
    check_rolled_back(s, "OLD=1\n");
}

TEST_CASE("verify: the wrong max_model_len fails and is rolled back") {
    Site s("wrong_max_len");
    std::ofstream(s.recipe / ".env") << "OLD=1\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("max_model_len: expected 262144, the server reports 131072") != std::string::npos);
    check_rolled_back(s, "OLD=1\n");
}

TEST_CASE("verify: a missing proof line (wrong draft length) fails and is rolled back") {
    Site s("missing_proof");
    std::ofstream(s.recipe / ".env") << "OLD=1\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("proof line /num_spec_tokens=6\\b/ not found") != std::string::npos);
    check_rolled_back(s, "OLD=1\n");
}

TEST_CASE("verify: no KV cache line fails and is rolled back") {
    Site s("no_kv_line");
    std::ofstream(s.recipe / ".env") << "OLD=1\n";
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("no KV cache line") != std::string::npos);
    check_rolled_back(s, "OLD=1\n");
}

TEST_CASE("rollback: with no .env before, the new one is removed") {
    Site s("wrong_model");
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.out.find("removed the new .env (there was none before)") != std::string::npos);
    CHECK_FALSE(fs::exists(s.recipe / ".env"));
}

TEST_CASE("rollback: a failed switch withdraws the node's endpoint and names the last good profile") {
    Site s;
    REQUIRE(s.run({"up", "capture", "--node", "test"}) == kOk);
    REQUIRE(fs::exists(s.fragments / "test.toml"));
    std::string good_env = s.env();
    s.set_variant("missing_proof");
    CHECK(s.run({"up", "best", "--node", "test"}) == kFailed);
    CHECK(s.env() == good_env);
    CHECK_FALSE(fs::exists(s.fragments / "test.toml"));
    CHECK(s.out.find("withdrew the gateway endpoint") != std::string::npos);
    CHECK(s.out.find("`pulse model up qwen38/capture --node test` brings the previous profile back") != std::string::npos);
}

// ---- down, status ----------------------------------------------------------------------------------

TEST_CASE("down: stops the server, withdraws the endpoint, marks the node state down") {
    Site s;
    REQUIRE(s.run({"up", "capture", "--node", "test"}) == kOk);
    REQUIRE(s.server_answers());
    REQUIRE(s.run({"down", "--node", "test"}) == kOk);
    CHECK_FALSE(s.server_answers());
    CHECK_FALSE(fs::exists(s.fragments / "test.toml"));
    std::string state = slurp(s.state / "nodes/test.json");
    CHECK(state.find("\"status\": \"down\"") != std::string::npos);
    CHECK(state.find("\"profile\": \"qwen38/capture\"") != std::string::npos);
    CHECK(s.out.find("MemAvailable 114.4 GiB") != std::string::npos);
}

TEST_CASE("status: up shows model, profile, memory and the gateway's view; down exits 1") {
    Site s;
    CHECK(s.run({"status", "--node", "test"}) == kFailed);
    CHECK(s.out.find("server    down") != std::string::npos);
    CHECK(s.out.find("profile   unknown") != std::string::npos);
    REQUIRE(s.run({"up", "best", "--node", "test"}) == kOk);
    REQUIRE(s.run({"status", "--node", "test"}) == kOk);
    INFO(s.out);
    CHECK(s.out.find("server    up on port " + std::to_string(s.port)) != std::string::npos);
    CHECK(s.out.find("model     qwen3.8-flash-next (max_model_len 262144)") != std::string::npos);
    CHECK(s.out.find("profile   qwen38/best (state up") != std::string::npos);
    CHECK(s.out.find("memory    MemAvailable 20.0 GiB") != std::string::npos);
    CHECK(s.out.find("gateway   gateway not reachable at http://127.0.0.1:1") != std::string::npos);
}

// A missing recipe directory on a node that answers is said as such, not as an unreachable node.
TEST_CASE("status: a missing recipe directory is named, the node is not called unreachable") {
    Site s;
    fs::rename(s.recipe, s.recipe.string() + ".moved");
    CHECK(s.run({"status", "--node", "test"}) == kFailed);
    INFO(s.out);
    CHECK(s.out.find("recipe directory " + s.recipe.string() + " is missing or not accessible") != std::string::npos);
    CHECK(s.out.find("not reachable: ") == std::string::npos);
    fs::rename(s.recipe.string() + ".moved", s.recipe);
}

// A user who cannot write the state directory is told that, not that another command holds
// the node's lock (the old message: "locked by another `pulse model` command (...: No such
// file or directory)").
TEST_CASE("down: a state directory this user cannot write is a permission error, not a lock held by another command") {
    Site s;
    fs::create_directories(s.state / "locks");
    // The controller runs in a child: as nobody when this test runs as root (root writes
    // anywhere), else as this user with the lock directory read-only.
    const bool root = ::geteuid() == 0;
    if (root) {
        for (const auto& p : {s.tmp.path(), s.state, s.state / "locks"}) fs::permissions(p, fs::perms::owner_all | fs::perms::group_read |
                                                                                              fs::perms::group_exec | fs::perms::others_read |
                                                                                              fs::perms::others_exec);
        for (const auto& e : fs::recursive_directory_iterator(s.tmp.path()))
            fs::permissions(e.path(), fs::perms::others_read | (e.is_directory() ? fs::perms::others_exec : fs::perms::none), fs::perm_options::add);
    } else {
        fs::permissions(s.state / "locks", fs::perms::owner_read | fs::perms::owner_exec);
    }
    int pipe_fd[2];
    REQUIRE(::pipe(pipe_fd) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(pipe_fd[0]);
        if (root && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(99);
        const int rc = s.run({"down", "--node", "test"});
        (void)!::write(pipe_fd[1], s.out.data(), s.out.size());
        ::_exit(rc);
    }
    ::close(pipe_fd[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(pipe_fd[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(pipe_fd[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    INFO(out);
    CHECK(WEXITSTATUS(status) == kFailed);
    CHECK(out.find("cannot create the lock file " + (s.state / "locks/test.lock").string() + ": Permission denied") != std::string::npos);
    CHECK(out.find("is not writable by this user") != std::string::npos);
    CHECK(out.find("locked by another") == std::string::npos);
    fs::permissions(s.state / "locks", fs::perms::owner_all, fs::perm_options::add);
}

// ---- remote nodes ------------------------------------------------------------------------------------

struct FakeSshPath {
    std::string old = std::getenv("PATH");
    explicit FakeSshPath(const fs::path& log) {
        setenv("PATH", ((fs::path(PULSE_SOURCE_ROOT) / "tests/runtime/bin").string() + ":" + old).c_str(), 1);
        setenv("FAKE_SSH_LOG", log.c_str(), 1);
    }
    ~FakeSshPath() {
        setenv("PATH", old.c_str(), 1);
        unsetenv("FAKE_SSH_LOG");
    }
};

TEST_CASE("ssh: every step of a remote node runs through ssh -o BatchMode=yes with its options") {
    Site s;
    FakeSshPath path(s.tmp / "ssh.log");
    REQUIRE(s.run({"up", "capture", "--node", "remote"}) == kOk);
    std::string calls = slurp(s.tmp / "ssh.log");
    auto lines = count(calls, "\n");
    CHECK(lines >= 7);  // preflight, stop, meminfo, write, start, probe(s), log
    CHECK(count(calls, "-o BatchMode=yes -o ConnectTimeout=10 -p 2222 ops@spark1 bash -s\n") == lines);
    CHECK(s.out.find("via ssh -o BatchMode=yes") != std::string::npos);
    REQUIRE(s.run({"down", "--node", "remote"}) == kOk);
}

TEST_CASE("ssh: an unreachable node fails the preflight with ssh's reason, nothing runs") {
    Site s;
    FakeSshPath path(s.tmp / "ssh.log");
    CHECK(s.run({"up", "capture", "--node", "unreachable"}) == kFailed);
    CHECK(s.out.find("exit 255 (ssh could not connect or authenticate: ops@unreachable: Permission denied (publickey).") != std::string::npos);
    CHECK_FALSE(fs::exists(s.recipe / "calls.log"));
    CHECK(s.run({"status", "--node", "unreachable"}) == kFailed);
    CHECK(s.out.find("node not reachable") != std::string::npos);
}

// ---- transport -----------------------------------------------------------------------------------------

TEST_CASE("transport: output, exit code, stdin script and timeouts (the process group is killed)") {
    Node n;
    auto t = make_transport(n);
    RunResult r = t->run("echo out; echo err >&2; exit 3\n", 10);
    CHECK(r.exit_code == 3);
    CHECK(r.output.find("out") != std::string::npos);
    CHECK(r.output.find("err") != std::string::npos);
    TempDir d;
    auto mark = d / "survivor";
    r = t->run("(sleep 1; touch '" + mark.string() + "') & sleep 30\n", 0.3);
    CHECK(r.timed_out);
    CHECK_FALSE(r.ok());
    ::usleep(1800000);
    CHECK_FALSE(fs::exists(mark));  // the background child died with its group
    r = run_process({"/nonexistent/binary"}, "", 5);
    CHECK(r.exit_code == 127);
    // A script that exits before reading the rest of stdin: EPIPE, not a SIGPIPE that would
    // kill this process (and `pulse model` with it).
    r = t->run("exit 4\n" + std::string(1 << 20, '#'), 10);
    CHECK(r.exit_code == 4);
}
