// Plugin loading: the good plugins, and the exact one-line message for every broken shape.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <string>

#include "plugin/host_api.h"
#include "plugin/plugin_manager.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace pulse::plugin;
using pulse::test::TempDir;

namespace {

fs::path built(const std::string& name) {
    const char* dir = std::getenv("PULSE_TEST_PLUGIN_DIR");
    REQUIRE_MESSAGE(dir, "PULSE_TEST_PLUGIN_DIR must point at the built test plugins");
    return fs::path(dir) / (name + ".so");
}

// A plugin directory holding copies of the named test plugins, mode 0755.
struct PluginDir {
    TempDir tmp;
    explicit PluginDir(std::initializer_list<std::string> names) {
        for (const auto& n : names) add(n);
    }
    fs::path add(const std::string& name, const std::string& as = "") {
        fs::path dst = tmp / ((as.empty() ? name : as) + ".so");
        fs::copy_file(built(name), dst, fs::copy_options::overwrite_existing);
        fs::permissions(dst, fs::perms(0755));
        return dst;
    }
    Options options(std::vector<std::string> require = {}) const {
        Options o;
        o.dirs = {tmp.path()};
        o.require = std::move(require);
        return o;
    }
};

const PluginStatus& only(const PluginManager& pm) {
    REQUIRE(pm.statuses().size() == 1);
    return pm.statuses()[0];
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("a good C plugin loads and its controller is registered") {
    PluginDir dir{"good_minimal"};
    PluginManager pm(dir.options());
    pm.load_all();
    const auto& s = only(pm);
    CHECK(s.state == State::loaded);
    CHECK(s.id == "test.good-minimal");
    CHECK(s.version == "1.2.3");
    CHECK(s.kinds == PULSE_KIND_CONTROLLER);
    CHECK(s.abi_major == 1);
    REQUIRE(s.components.size() == 1);
    CHECK(s.components[0] == "controller test-controller");
    auto lease = pm.controller("test-controller");
    REQUIRE(lease);
    CHECK(lease->plugin_id() == "test.good-minimal");
    CHECK(pm.fatal_problems().empty());

    // Drive the controller through the host tables.
    struct Capture : pulse_output {
        std::string text;
        void write(std::string_view t) override { text += t; }
    } out;
    pulse_call call;
    void* ctl = nullptr;
    const auto& vt = lease->registration.controller;
    REQUIRE(vt.create(lease->registration.user, &call, nullptr, &ctl) == PULSE_OK);
    pulse_str_t argv[] = {{"up", 2}, {"best", 4}};
    int32_t code = -1;
    REQUIRE(vt.command(ctl, &call, 2, argv, &out, &code) == PULSE_OK);
    CHECK(out.text == "args: up best\n");
    CHECK(code == 2);
    vt.destroy(ctl);
}

TEST_CASE("a C++ plugin through plugin.hpp: translation profile driven through the host JSON API") {
    PluginDir dir{"good_cpp"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(only(pm).state == State::loaded);
    CHECK(contains(only(pm).build_info, "C++"));
    auto lease = pm.translation("test-profile");
    REQUIRE(lease);
    const auto& vt = lease->registration.translation;
    CHECK(vt.struct_size == sizeof(pulse_translation_vt_t));
    const bool has_map_error = vt.map_error != nullptr;  // an optional hook this profile leaves out
    CHECK_FALSE(has_map_error);

    rapidjson::Document opts;
    opts.Parse(R"({"prefix":">> "})");
    pulse_call call;
    void* inst = nullptr;
    REQUIRE(vt.create(lease->registration.user, &call, pulse::host::view(&opts), &inst) == PULSE_OK);

    rapidjson::Document req;
    req.Parse(R"({"model":"m","input":"hello \"world\""})");
    pulse_upstream_req out;
    REQUIRE(vt.build_request(inst, &call, pulse::host::view(&req), nullptr, &out) == PULSE_OK);
    CHECK(out.body.text() == R"({"prompt":"hello \"world\""})");

    struct Deltas : pulse_delta_sink {
        std::string got_text;
        int got_finish = -1;
        pulse_status_t text(std::string_view t) override { got_text += t; return PULSE_OK; }
        pulse_status_t reasoning(std::string_view) override { return PULSE_OK; }
        pulse_status_t tool_begin(uint32_t, pulse_tool_kind_t, std::string_view, std::string_view, std::string_view) override { return PULSE_OK; }
        pulse_status_t tool_args(uint32_t, std::string_view) override { return PULSE_OK; }
        pulse_status_t tool_end(uint32_t) override { return PULSE_OK; }
        pulse_status_t finish(pulse_finish_t r) override { got_finish = r; return PULSE_OK; }
        pulse_status_t usage(const pulse_usage_t&) override { return PULSE_OK; }
        pulse_status_t error(pulse_status_t, std::string_view) override { return PULSE_OK; }
    } sink;
    void* stream = nullptr;
    REQUIRE(vt.stream_open(inst, &call, pulse::host::view(&req), &stream) == PULSE_OK);
    REQUIRE(vt.stream_feed(stream, &call, {"abc", 3}, &sink) == PULSE_OK);
    REQUIRE(vt.stream_finish(stream, &call, PULSE_STREAM_CLEAN, &sink) == PULSE_OK);
    vt.stream_close(stream);
    CHECK(sink.got_text == ">> abc");
    CHECK(sink.got_finish == PULSE_FINISH_STOP);

    // The plugin's own validation error comes back through set_error.
    rapidjson::Document bad;
    bad.Parse("[1]");
    pulse_call call2;
    void* inst2 = nullptr;
    CHECK(vt.create(lease->registration.user, &call2, pulse::host::view(&bad), &inst2) == PULSE_E_INVALID_ARGUMENT);
    CHECK(call2.message == "profile options must be a table");
    vt.destroy(inst);
}

TEST_CASE("a plugin built for ABI v2 is rejected at pre-flight") {
    PluginDir dir{"entry_v2_only"};
    PluginManager pm(dir.options());
    pm.load_all();
    const auto& s = only(pm);
    CHECK(s.state == State::rejected);
    CHECK(s.reason == "built for Pulse plugin ABI v2, this host speaks v1 (fix: install the v1 build of the plugin, "
                      "or a Pulse that speaks v2)");
    CHECK(s.describe() == "plugin " + (dir.tmp / "entry_v2_only.so").string() + ": rejected: " + s.reason);
}

TEST_CASE("a plugin requiring a newer minor is rejected with the remedy") {
    PluginDir dir{"needs_newer_minor"};
    PluginManager pm(dir.options());
    pm.load_all();
    const auto& s = only(pm);
    CHECK(s.state == State::rejected);
    CHECK(s.id == "test.needs-newer-minor");
    CHECK(s.reason == "requires host plugin ABI >= 1.99, this host is 1.4 (fix: upgrade Pulse, or rebuild the plugin "
                      "with PULSE_TARGET_ABI_MINOR=4)");
    CHECK(contains(s.describe(), "(test.needs-newer-minor 0.0.1): rejected: requires host plugin ABI >= 1.99"));
}

TEST_CASE("a shared object without the entry point") {
    PluginDir dir{"missing_entry"};
    PluginManager pm(dir.options());
    pm.load_all();
    CHECK(only(pm).state == State::rejected);
    CHECK(only(pm).reason ==
          "no entry point: expected an exported symbol pulse_plugin_entry_v1, found none (fix: define it with "
          "PULSE_EXPORT, or remove the file if it is not a Pulse plugin)");
}

TEST_CASE("a file that is not ELF") {
    TempDir tmp;
    auto f = tmp.write("notes.so", "this is not a library\n");
    fs::permissions(f, fs::perms(0644));
    Options o;
    o.dirs = {tmp.path()};
    PluginManager pm(o);
    pm.load_all();
    CHECK(only(pm).state == State::rejected);
    CHECK(contains(only(pm).reason, "not an ELF shared object: expected the ELF magic"));
}

TEST_CASE("init failures: with a message, without one, and a thrown exception") {
    PluginDir dir{"init_fails_with_message", "init_fails_without_message", "throws_in_init"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(pm.statuses().size() == 3);
    for (const auto& s : pm.statuses()) {
        CAPTURE(s.describe());
        CHECK(s.state == State::failed);
        if (s.id == "test.init-fails-with-message")
            CHECK(s.reason == "init failed: model directory /nonexistent is missing");
        else if (s.id == "test.init-fails-without-message")
            CHECK(s.reason == "init failed: plugin 'test.init-fails-without-message' returned INTERNAL (-7) without an "
                              "error message (plugin bug)");
        else
            CHECK(s.reason == "init failed: boom from init");
    }
    CHECK(pm.component_names(PULSE_KIND_TRANSLATION).empty());
    CHECK(pm.fatal_problems().empty());  // none of them is required
}

TEST_CASE("required plugins that fail stop startup; optional ones are skipped") {
    PluginDir dir{"init_fails_with_message", "good_minimal"};
    PluginManager pm(dir.options({"test.init-fails-with-message", "test.not-installed"}));
    pm.load_all();
    auto fatal = pm.fatal_problems();
    REQUIRE(fatal.size() == 2);
    CHECK(contains(fatal[0], "(test.init-fails-with-message 0.0.1): failed: init failed"));
    CHECK(contains(fatal[1], "required plugin 'test.not-installed' was not found in the plugin directories (searched: " +
                                 dir.tmp.path().string() + ")"));
    CHECK(pm.controller("test-controller"));
}

TEST_CASE("duplicate plugin ids: neither file is loaded, and each says where the other is") {
    // The first by name is not the one meant more often than not (1.0.0 beat 1.0.1).
    PluginDir dir{"good_minimal", "good_minimal_dup"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(pm.statuses().size() == 2);
    const auto& first = pm.statuses()[0];
    const auto& dup = pm.statuses()[1];
    CHECK(first.state == State::rejected);
    CHECK(first.reason == "duplicate plugin id 'test.good-minimal': also in " + (dir.tmp / "good_minimal_dup.so").string() +
                              "; neither file is loaded (fix: remove one of the two)");
    CHECK(first.components.empty());
    CHECK(dup.state == State::rejected);
    CHECK(dup.reason == "duplicate plugin id 'test.good-minimal': also in " + (dir.tmp / "good_minimal.so").string() +
                            "; neither file is loaded (fix: remove one of the two)");
    CHECK(contains(dup.describe(), (dir.tmp / "good_minimal_dup.so").string()));
    CHECK(pm.controller("test-controller") == nullptr);
}

TEST_CASE("what a plugin directory holds that could be a plugin is listed as skipped; what cannot be one is ignored") {
    PluginDir dir{"good_minimal"};
    fs::create_directories(dir.tmp / "old");
    fs::copy_file(built("good_minimal"), dir.tmp / "old" / "good_minimal.so");    // a plugin one level down
    fs::copy_file(built("good_minimal"), dir.tmp / "shout.so.disabled");          // named like one
    fs::copy_file(built("good_minimal"), dir.tmp / "renamed-plugin");             // a shared object by content
    // What a build tree's plugin folder also holds (meson): object folders, static archives.
    fs::create_directories(dir.tmp / "good_minimal.so.p");
    { std::ofstream(dir.tmp / "good_minimal.so.p" / "plugin.cpp.o") << "\x7f" "ELF object"; }
    { std::ofstream(dir.tmp / "libpulse_helpers.a") << "!<arch>\n"; }
    { std::ofstream(dir.tmp / "README.md") << "site plugins\n"; }
    fs::create_directories(dir.tmp / "empty");
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(pm.statuses().size() == 4);
    CHECK(pm.statuses()[0].state == State::skipped);
    CHECK(pm.statuses()[0].path == dir.tmp / "old");
    CHECK(pm.statuses()[0].reason == "a directory (plugin directories are not searched recursively)");
    CHECK(pm.statuses()[1].path == dir.tmp / "renamed-plugin");
    CHECK(pm.statuses()[1].reason == "not a plugin file name (only *.so files are loaded)");
    CHECK(pm.statuses()[2].path == dir.tmp / "shout.so.disabled");
    CHECK(pm.statuses()[2].reason == "not a plugin file name (only *.so files are loaded)");
    CHECK(pm.statuses()[3].state == State::loaded);
}

TEST_CASE("the build tree's plugin folder: every row is a plugin, loaded") {
    const char* build_plugins = std::getenv("PULSE_PLUGIN_BUILD_DIR");
    REQUIRE_MESSAGE(build_plugins, "PULSE_PLUGIN_BUILD_DIR must point at the build's plugin folder");
    Options o;
    o.dirs = {build_plugins};
    PluginManager pm(o);
    pm.load_all();
    CHECK(pm.statuses().size() >= 5);
    for (const auto& s : pm.statuses()) {
        CAPTURE(s.describe());
        CHECK(s.state == State::loaded);
    }
}

TEST_CASE("two plugins providing the same component name") {
    PluginDir dir{"good_minimal", "good_minimal_other"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(pm.statuses().size() == 2);
    CHECK(pm.statuses()[1].state == State::failed);
    CHECK(contains(pm.statuses()[1].reason, "controller 'test-controller' is already provided by plugin test.good-minimal"));
    CHECK(pm.controller("test-controller")->plugin_id() == "test.good-minimal");
}

TEST_CASE("plugin files writable by group or others are refused with the fix") {
    PluginDir dir{};
    auto f = dir.add("good_minimal");
    fs::permissions(f, fs::perms(0666));
    PluginManager pm(dir.options());
    pm.load_all();
    CHECK(only(pm).state == State::rejected);
    CHECK(only(pm).reason == "file mode: expected not writable by group or others, found 0666 (fix: chmod go-w " +
                                 f.string() + ")");
    CHECK(pm.controller("test-controller") == nullptr);
}

TEST_CASE("a plugin directory writable by others is ignored whole") {
    PluginDir dir{"good_minimal"};
    fs::permissions(dir.tmp.path(), fs::perms(0777));
    PluginManager pm(dir.options());
    pm.load_all();
    CHECK(only(pm).state == State::rejected);
    CHECK(contains(only(pm).reason, "whole directory ignored: directory mode: expected not writable by group or others, found 0777"));
    fs::permissions(dir.tmp.path(), fs::perms(0700));
}

TEST_CASE("plugin files owned by another user are refused") {
    if (geteuid() != 0) {
        MESSAGE("not root: cannot chown a file to another user here; this case runs in CI (root)");
        return;
    }
    PluginDir dir{};
    auto f = dir.add("good_minimal");
    REQUIRE(chown(f.c_str(), 65534, 65534) == 0);
    PluginManager pm(dir.options());
    pm.load_all();
    CHECK(only(pm).state == State::rejected);
    CHECK(contains(only(pm).reason, "file owner: expected root or the service user"));
    CHECK(contains(only(pm).reason, "(fix: chown root " + f.string() + ")"));
}

TEST_CASE("probe returning false: skipped when optional, failed when required") {
    {
        PluginDir dir{"probe_returns_zero"};
        PluginManager pm(dir.options());
        pm.load_all();
        CHECK(only(pm).state == State::skipped);
        CHECK(only(pm).reason == "not available on this system: no CUDA driver found");
        CHECK(pm.fatal_problems().empty());
    }
    {
        PluginDir dir{"probe_returns_zero"};
        PluginManager pm(dir.options({"test.probe-returns-zero"}));
        pm.load_all();
        CHECK(only(pm).state == State::failed);
        CHECK(pm.fatal_problems().size() == 1);
    }
}

TEST_CASE("invalid ids and undeclared component kinds") {
    PluginDir dir{"bad_id", "registers_undeclared_kind"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(pm.statuses().size() == 2);
    CHECK(pm.statuses()[0].state == State::rejected);
    CHECK(pm.statuses()[0].reason == "id: expected 1-128 characters of [a-z0-9._-], found 'Bad ID!'");
    CHECK(pm.statuses()[1].state == State::failed);
    CHECK(pm.statuses()[1].reason ==
          "registration failed: registered a backend ('sneaky') but the plugin info does not declare that kind");
    CHECK(pm.backend("sneaky") == nullptr);
}

TEST_CASE("an init that passes on a refused registration's status is reported with the refusal, not as a plugin without a message") {
    PluginDir dir{"passes_on_refusal"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(pm.statuses().size() == 1);
    CHECK(pm.statuses()[0].state == State::failed);
    CHECK(pm.statuses()[0].reason ==
          "init failed: the host refused its registration: registered a backend ('sneaky') but the plugin info does not declare that kind");
}

TEST_CASE("missing plugin directories are not fatal; drop-ins are optional") {
    Options o;
    o.dirs = {"/nonexistent/pulse/plugins"};
    o.dropin_dirs = {"/nonexistent/pulse/plugins.d"};
    PluginManager pm(o);
    pm.load_all();
    CHECK(pm.statuses().empty());
    CHECK(pm.fatal_problems().empty());
}

TEST_CASE("an unresolved symbol names the symbol, the installed file and the fix; no staged path, no errno") {
    PluginDir dir{"undefined_symbol"};
    TempDir run;
    Options o = dir.options();
    o.runtime_dir = run / "staged";  // loaded from a staged copy, as `pulse serve` does
    PluginManager pm(o);
    pm.load_all();
    const auto& st = only(pm);
    CAPTURE(st.reason);
    CHECK(st.state == State::rejected);
    CHECK(contains(st.reason, "dlopen failed: unresolved symbol 'pulse_test_symbol_nobody_defines'"));
    CHECK(contains(st.reason, (dir.tmp / "undefined_symbol.so").string() + ": undefined symbol: pulse_test_symbol_nobody_defines"));
    CHECK(contains(st.reason, "-Wl,-z,defs"));
    CHECK(!contains(st.reason, (run / "staged").string()));
    CHECK(!contains(st.reason, "Bad file descriptor"));
    CHECK(!contains(st.reason, "boost::"));
}

TEST_CASE("dlopen failure text: a missing library is named with the fix") {
    const fs::path path = "/opt/p/x.so", mapped = "/run/pulse-gateway/x-abc.so";
    auto text = dlopen_failure(
        "boost::dll::shared_library::load() failed (dlerror system message: libcudart.so.13: cannot open shared object file: "
        "No such file or directory): Bad file descriptor",
        mapped, path);
    CHECK(text == "dlopen failed: a library the plugin needs is missing: libcudart.so.13: cannot open shared object file: No such "
                  "file or directory (fix: install libcudart.so.13, or give the plugin a RUNPATH where it lives)");
    text = dlopen_failure("boost::dll::shared_library::load() failed (dlerror system message: /run/pulse-gateway/x-abc.so: version "
                          "`GLIBCXX_3.4.32' not found (required by /run/pulse-gateway/x-abc.so)): Bad file descriptor",
                          mapped, path);
    CHECK(contains(text, "/opt/p/x.so: version `GLIBCXX_3.4.32' not found (required by /opt/p/x.so)"));
    CHECK(contains(text, "build it on Debian 12 or older"));
    CHECK(!contains(text, "Bad file descriptor"));
}

TEST_CASE("a symlinked plugin whose target lies in a directory others can write is refused") {
    PluginDir dir{};
    TempDir elsewhere;
    fs::create_directories(elsewhere / "open");
    fs::copy_file(built("good_minimal"), elsewhere / "open" / "good_minimal.so");
    fs::permissions(elsewhere / "open" / "good_minimal.so", fs::perms(0755));
    fs::permissions(elsewhere / "open", fs::perms(0777));
    fs::create_symlink(elsewhere / "open" / "good_minimal.so", dir.tmp / "linked.so");
    {
        PluginManager pm(dir.options());
        pm.load_all();
        CAPTURE(only(pm).reason);
        CHECK(only(pm).state == State::rejected);
        CHECK(contains(only(pm).reason, "symlink to " + (elsewhere / "open" / "good_minimal.so").string() + ", whose directory is unsafe: directory mode: expected not writable by group or others, found 0777"));
        CHECK(pm.controller("test-controller") == nullptr);
    }
    fs::permissions(elsewhere / "open", fs::perms(0755));  // the same link into a safe directory loads
    PluginManager pm(dir.options());
    pm.load_all();
    CHECK(only(pm).state == State::loaded);
}

TEST_CASE("a symlink that hops through a directory others can write is refused, though its final target is safe") {
    PluginDir dir{};
    TempDir elsewhere;
    fs::create_directories(elsewhere / "safe");
    fs::create_directories(elsewhere / "open");
    fs::copy_file(built("good_minimal"), elsewhere / "safe" / "good_minimal.so");
    fs::permissions(elsewhere / "safe" / "good_minimal.so", fs::perms(0755));
    fs::create_symlink(elsewhere / "safe" / "good_minimal.so", elsewhere / "open" / "hop.so");
    fs::permissions(elsewhere / "open", fs::perms(0777));  // anyone can retarget hop.so
    fs::create_symlink(elsewhere / "open" / "hop.so", dir.tmp / "linked.so");
    {
        PluginManager pm(dir.options());
        pm.load_all();
        CAPTURE(only(pm).reason);
        CHECK(only(pm).state == State::rejected);
        CHECK(contains(only(pm).reason, "symlink through " + (elsewhere / "open" / "hop.so").string() + ", whose directory is unsafe: directory " +
                                            (elsewhere / "open").string() + " on its path: mode: expected not writable by group or others, found 0777"));
    }
    fs::permissions(elsewhere / "open", fs::perms(0755));
    PluginManager pm(dir.options());
    pm.load_all();
    CHECK(only(pm).state == State::loaded);
}

TEST_CASE("a plugin directory below a directory others can write is ignored whole (a sticky one, as /tmp, is fine)") {
    TempDir top;
    fs::create_directories(top / "open" / "plugins");
    fs::permissions(top / "open" / "plugins", fs::perms(0755));
    fs::copy_file(built("good_minimal"), top / "open" / "plugins" / "good_minimal.so");
    fs::permissions(top / "open" / "plugins" / "good_minimal.so", fs::perms(0755));
    fs::permissions(top / "open", fs::perms(0777));
    Options o;
    o.dirs = {top / "open" / "plugins"};
    {
        PluginManager pm(o);
        pm.load_all();
        CAPTURE(only(pm).reason);
        CHECK(only(pm).state == State::rejected);
        CHECK(contains(only(pm).reason, "whole directory ignored: directory " + (top / "open").string() +
                                            " on its path: mode: expected not writable by group or others, found 0777"));
    }
    fs::permissions(top / "open", fs::perms(01777));  // sticky: nobody else can replace plugins/
    PluginManager pm(o);
    pm.load_all();
    CHECK(only(pm).state == State::loaded);
}

TEST_CASE("a reload that finds a plugin directory others can write says so") {
    PluginDir dir{"good_minimal"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(only(pm).state == State::loaded);
    fs::permissions(dir.tmp.path(), fs::perms(0777));
    auto rep = pm.reload();
    fs::permissions(dir.tmp.path(), fs::perms(0700));
    CHECK(rep.failed == 1);
    REQUIRE(rep.messages.size() == 1);
    CHECK(rep.messages[0] == "plugin directory " + dir.tmp.path().string() +
                                 ": whole directory ignored by the reload: directory mode: expected not writable by group or others, found 0777 (fix: chmod go-w " +
                                 dir.tmp.path().string() + ")");
    CHECK(pm.controller("test-controller") != nullptr);  // what was loaded keeps serving
}

TEST_CASE("deinit runs exactly once per successful init: conflicts, shutdown, destruction") {
    TempDir tmp;
    auto log_path = tmp / "deinit.log";
    ::setenv("PULSE_TEST_DEINIT_LOG", log_path.c_str(), 1);
    auto lines = [&] {
        std::ifstream in(log_path);
        int n = 0;
        for (std::string l; std::getline(in, l);) n += l == "deinit state";
        return n;
    };
    {
        PluginDir dir{"deinit_log"};
        dir.add("deinit_log", "deinit_log_again");  // same id: refused before init, no deinit owed
        PluginManager pm(dir.options());
        pm.load_all();
        REQUIRE(pm.statuses().size() == 2);
        // The first copy was loaded, then taken back when the second turned up: deinit'ed then.
        CHECK(pm.statuses()[0].state == State::rejected);
        CHECK(lines() == 1);
        pm.shutdown();
        CHECK(lines() == 1);
        pm.shutdown();  // a second shutdown, then the destructor's: nothing more
    }
    CHECK(lines() == 1);
    ::unsetenv("PULSE_TEST_DEINIT_LOG");
}

TEST_CASE("the SDK example backend loads and streams Chat Completions chunks") {
    PluginDir dir{"example_echo"};
    PluginManager pm(dir.options());
    pm.load_all();
    REQUIRE(only(pm).state == State::loaded);
    auto lease = pm.backend("example-echo");
    REQUIRE(lease);
    const auto& vt = lease->registration.backend;
    pulse_call call;
    void* be = nullptr;
    REQUIRE(vt.create(lease->registration.user, &call, nullptr, &be) == PULSE_OK);
    rapidjson::Document req;
    req.Parse(R"({"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi there"}]})");
    void* st = nullptr;
    REQUIRE(vt.stream_start(be, &call, pulse::host::view(&req), &st) == PULSE_OK);
    struct Chunks : pulse_chunk_sink {
        std::vector<std::string> got;
        pulse_status_t data(std::string_view p) override { got.emplace_back(p); return PULSE_OK; }
    } sink;
    pulse_status_t rc;
    int guard = 0;
    while ((rc = vt.stream_next(st, &call, 1000, &sink)) == PULSE_OK && ++guard < 100) {
    }
    CHECK(rc == PULSE_END);
    vt.stream_close(st);
    REQUIRE(sink.got.size() == 6);  // role, "echo: ", "hi ", "there", finish, usage
    CHECK(contains(sink.got[0], R"("role":"assistant")"));
    CHECK(contains(sink.got[2], R"("content":"hi ")"));
    CHECK(contains(sink.got[4], R"("finish_reason":"stop")"));
    CHECK(contains(sink.got[5], R"("usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6})"));

    rapidjson::Document bad;
    bad.Parse(R"({"delay":1})");
    void* be2 = nullptr;
    pulse_call call2;
    CHECK(vt.create(lease->registration.user, &call2, pulse::host::view(&bad), &be2) == PULSE_E_INVALID_ARGUMENT);
    CHECK(contains(call2.message, "unknown or mistyped option 'delay'"));
    vt.destroy(be);
}

// ---- the host's JSON services, as a plugin calls them ----

TEST_CASE("JSON writer: every misuse fails the writer with the reason, in the bound call's error too") {
    const pulse_json_api_t* j = pulse::host::api()->json;
    auto str = [](const char* s) { return pulse_str_t{s, std::strlen(s)}; };
    struct Case {
        const char* what;
        std::function<bool(pulse_json_writer_t*)> steps;  // false once a step failed
        const char* reason;
    };
    const std::vector<Case> cases = {
        {"key at the top", [&](auto* w) { return j->key(w, str("k")); }, "JSON writer: key(): outside any object"},
        {"key in an array", [&](auto* w) { return j->begin_array(w) && j->key(w, str("k")); }, "JSON writer: key(): inside an array"},
        {"two keys", [&](auto* w) { return j->begin_object(w) && j->key(w, str("a")) && j->key(w, str("b")); },
         "JSON writer: key(): a second key in a row (the previous key has no value)"},
        {"value without key", [&](auto* w) { return j->begin_object(w) && j->i64(w, 1); },
         "JSON writer: i64(): a value inside an object where a key is expected (call key() first)"},
        {"end_object unopened", [&](auto* w) { return j->end_object(w); }, "JSON writer: end_object(): no object is open"},
        {"end_object on an array", [&](auto* w) { return j->begin_array(w) && j->end_object(w); },
         "JSON writer: end_object(): the innermost open container is an array"},
        {"end_object after a key", [&](auto* w) { return j->begin_object(w) && j->key(w, str("a")) && j->end_object(w); },
         "JSON writer: end_object(): the last key has no value"},
        {"end_array unopened", [&](auto* w) { return j->end_array(w); }, "JSON writer: end_array(): no array is open"},
        {"two roots", [&](auto* w) { return j->null(w) && j->null(w); }, "JSON writer: null(): a second top-level value (the writer holds exactly one)"},
        {"NaN", [&](auto* w) { return j->f64(w, std::nan("")); }, "JSON writer: f64(): NaN and infinity have no JSON form"},
        {"bad UTF-8", [&](auto* w) { return j->string(w, pulse_str_t{"\xff\xfe", 2}); }, "JSON writer: string(): the text is not valid UTF-8"},
        {"raw garbage", [&](auto* w) { return j->raw(w, str("{\"a\":}")); },
         "JSON writer: raw(): not a valid JSON value: Invalid value. at offset 5"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.what);
        pulse_call call;
        pulse_json_writer w;
        w.call = &call;
        CHECK_FALSE(c.steps(&w));
        CHECK(w.failed);
        CHECK(w.error == c.reason);
        CHECK(call.message == c.reason);  // a plugin returning an error without set_error reports it
        CHECK_FALSE(j->null(&w));         // a failed writer stays failed
        CHECK_FALSE(w.complete());
    }
    // A plugin's own message wins over the writer's.
    pulse_call call;
    pulse::host::api()->set_error(&call, PULSE_E_INTERNAL, str("mine"));
    pulse_json_writer w;
    w.call = &call;
    CHECK_FALSE(j->end_array(&w));
    CHECK(call.message == "mine");
    // And a correct sequence is complete.
    pulse_json_writer ok;
    CHECK((j->begin_object(&ok) && j->key(&ok, str("a")) && j->begin_array(&ok) && j->i64(&ok, 1) && j->raw(&ok, str("{\"x\":[true]}")) &&
           j->end_array(&ok) && j->key(&ok, str("b")) && j->f64(&ok, 0.5) && j->end_object(&ok)));
    CHECK(ok.complete());
    CHECK(ok.text() == R"({"a":[1,{"x":[true]}],"b":0.5})");
}

TEST_CASE("json->parse: invalid JSON gives NULL and the reason as the call's error") {
    const pulse_json_api_t* j = pulse::host::api()->json;
    pulse_call call;
    CHECK(j->parse(&call, pulse_str_t{"{\"a\":1,}", 8}) == nullptr);
    CHECK(call.message == "invalid JSON: Missing a name for object member. at offset 7");
    CHECK(pulse::host::call_error(call, PULSE_E_INVALID_ARGUMENT, "p") == call.message);
    const pulse_json_t* v = j->parse(&call, pulse_str_t{"[1,2]", 5});
    REQUIRE(v);
    CHECK(j->size(v) == 2);
}
