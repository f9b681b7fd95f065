// Config loading: the shipped default, every kind of error message, env overrides.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <map>
#include <string>

#include "config/config.h"
#include "support/temp_dir.h"

using namespace pulse::config;

namespace {

std::string error_of(const std::string& toml) {
    try {
        Config c = load_string(toml, "test.toml");
        validate(c);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

const char* kMinimalModel = R"(
[models.m]
profile = "qwen38"
[[models.m.endpoints]]
url = "http://127.0.0.1:8888/v1"
)";

std::map<std::string, std::string> g_env;
const char* fake_getenv(const char* name) {
    auto it = g_env.find(name);
    return it == g_env.end() ? nullptr : it->second.c_str();
}

}  // namespace

TEST_CASE("the shipped config/pulse.toml loads with the documented defaults") {
    Config c = load_file(PULSE_SOURCE_ROOT "/config/pulse.toml");
    validate(c);
    CHECK(c.server.listen.host == "127.0.0.1");
    CHECK(c.server.listen.port == 8800);
    CHECK(c.server.max_streams >= 256);
    CHECK(c.upstream.retry_window_s == 180);
    CHECK(c.upstream.keepalive_s == 10);
    CHECK(c.upstream.connect_timeout_s == 3);
    REQUIRE(c.models.size() == 1);  // what the site configures; the demo model is opt-in
    REQUIRE(c.find_model("qwen3.8-flash-next"));
    const Model& m = *c.find_model("qwen3.8-flash-next");
    CHECK(m.id == "qwen3.8-flash-next");
    CHECK(m.profile == "qwen38");
    CHECK(m.context_window == 262144);  // the shipped runtime profiles' --max-model-len
    REQUIRE(m.endpoints.size() == 1);
    CHECK(m.endpoints[0].url == "http://127.0.0.1:8888/v1");
    CHECK(m.sampling.temperature.value() == doctest::Approx(0.6));
    CHECK(m.sampling.top_k.value() == 20);
    CHECK_FALSE(m.sampling.max_output_tokens.has_value());
    CHECK(m.profile_options_json == "{}");
    CHECK(c.plugins.dirs.empty());
    CHECK(c.upstream.endpoint_fragments == "/var/lib/pulse-gateway/endpoints.d");
    CHECK(c.plugins.dropin_dirs == std::vector<std::filesystem::path>{"/etc/pulse-gateway/plugins.d"});
}

TEST_CASE("the demo model's table, appended to the shipped config, adds a demo model served in-process") {
    std::ifstream a(PULSE_SOURCE_ROOT "/config/pulse.toml"), b(PULSE_SOURCE_ROOT "/config/demo-model.toml");
    std::stringstream text;
    text << a.rdbuf() << "\n" << b.rdbuf();
    Config c = load_string(text.str(), "pulse.toml");
    validate(c);
    REQUIRE(c.models.size() == 2);
    CHECK_FALSE(c.find_model("qwen3.8-flash-next")->demo);
    REQUIRE(c.find_model("pulse-demo"));
    const Model& demo = *c.find_model("pulse-demo");
    CHECK(demo.demo);
    REQUIRE(demo.endpoints.size() == 1);
    CHECK(demo.endpoints[0].url == "plugin://decoder");
    CHECK(demo.endpoints[0].options_json == R"({"model":"/var/lib/pulse-gateway/pulse-demo.gguf","make_demo":true})");
    CHECK(demo.profile_options_json == R"({"thinking":"off"})");
}

TEST_CASE("an empty file gives built-in defaults") {
    Config c = load_string("", "empty.toml");
    CHECK(c.models.empty());
    CHECK(c.server.listen.port == 8800);
}

TEST_CASE("TOML syntax errors point at file:line:column") {
    std::string e = error_of("[server]\nlisten = \"127.0.0.1:8800\n");
    CHECK(e.find("test.toml:2:") == 0);
}

TEST_CASE("unknown keys are errors that list what is allowed") {
    std::string e = error_of("[server]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n");
    CHECK(e.find("test.toml:3:1: unknown key 'server.lisen'") == 0);
    CHECK(e.find("allowed here: listen, api_key") != std::string::npos);

    e = error_of("colour = 1\n");
    CHECK(e.find("test.toml:1:1: unknown key 'colour'") == 0);

    e = error_of("[models.m]\ntempreature = 1\nprofile = \"p\"\n");
    CHECK(e.find("test.toml:2:1: unknown key 'models.m.tempreature'") == 0);

    e = error_of(std::string(kMinimalModel) + "priority = 2\n");
    CHECK(e.find("unknown key 'models.m.endpoints[0].priority'; allowed here: name, url, weight, last_resort, options") != std::string::npos);

    e = error_of(std::string(kMinimalModel) + "[models.m.sampling]\ntop_q = 1\n");
    CHECK(e.find("unknown key 'models.m.sampling.top_q'") != std::string::npos);
    CHECK(e.find("top_p") != std::string::npos);
}

TEST_CASE("type and range errors name the key, the expected type and what was found") {
    std::string e = error_of("[server]\nmax_streams = \"lots\"\n");
    CHECK(e.find("test.toml:2:15: 'server.max_streams' must be an integer, found a string") == 0);

    e = error_of("[server]\nmax_streams = 0\n");
    CHECK(e.find("'server.max_streams' = 0 is out of range; allowed 1 to 65536") != std::string::npos);

    e = error_of("[upstream]\nkeepalive_s = -1\n");
    CHECK(e.find("'upstream.keepalive_s' = -1 is out of range") != std::string::npos);

    e = error_of("[plugins]\ndirs = [\"a\", 3]\n");
    CHECK(e.find("'plugins.dirs' must contain only strings, found an integer") != std::string::npos);

    e = error_of("log_level = \"loud\"\n");
    CHECK(e.find("log_level 'loud' is not one of") != std::string::npos);
}

TEST_CASE("models need a profile and endpoints with valid urls") {
    CHECK(error_of("[models.m]\n[[models.m.endpoints]]\nurl = \"http://x:1/v1\"\n").find("'models.m.profile' is required") !=
          std::string::npos);
    CHECK(error_of("[models.m]\nprofile = \"qwen38\"\n").find("model 'm' has no endpoints") != std::string::npos);
    CHECK(error_of("[models.m]\nprofile = \"p\"\n[[models.m.endpoints]]\nurl = \"ftp://x\"\n")
              .find("must start with http://, plugin://NAME or decoder:///path/model.gguf") != std::string::npos);
    CHECK(error_of("[models.m]\nprofile = \"p\"\n[[models.m.endpoints]]\nurl = \"https://x\"\n")
              .find("https upstreams are not supported") != std::string::npos);
    CHECK(error_of("[models.m]\nprofile = \"p\"\n[[models.m.endpoints]]\nname = \"a\"\nurl = \"http://x:1/v1\"\n"
                   "[[models.m.endpoints]]\nname = \"a\"\nurl = \"http://y:1/v1\"\n")
              .find("endpoint name 'a' is used twice") != std::string::npos);
}

TEST_CASE("endpoints keep failover order and plugin:// endpoints carry options as JSON") {
    Config c = load_string(R"(
[models.m]
profile = "p"
[[models.m.endpoints]]
name = "first"
url = "http://127.0.0.1:1/v1"
[[models.m.endpoints]]
url = "plugin://example-echo"
options = { delay_ms = 5, prefix = "x\"y" }
[models.m.profile_options]
reasoning = "raw"
nested = { list = [1, 2.5, true] }
)", "t.toml");
    REQUIRE(c.models[0].endpoints.size() == 2);
    CHECK(c.models[0].endpoints[0].name == "first");
    CHECK(c.models[0].endpoints[1].name == "ep1");
    CHECK(c.models[0].endpoints[1].is_plugin());
    CHECK(c.models[0].endpoints[1].plugin_name() == "example-echo");
    CHECK(c.models[0].endpoints[1].options_json == R"({"delay_ms":5,"prefix":"x\"y"})");
    CHECK(c.models[0].profile_options_json == R"({"nested":{"list":[1,2.5,true]},"reasoning":"raw"})");
    CHECK(c.models[0].upstream_model == "m");
}

TEST_CASE("listen addresses") {
    CHECK(parse_listen("127.0.0.1:8800", "x").port == 8800);
    CHECK(parse_listen("[::1]:9000", "x").host == "::1");
    CHECK(parse_listen("[::1]:9000", "x").is_loopback());
    CHECK(parse_listen("127.1.2.3:1", "x").is_loopback());
    CHECK_FALSE(parse_listen("0.0.0.0:1", "x").is_loopback());
    CHECK_THROWS_WITH_AS(parse_listen("8800", "ctx"), doctest::Contains("must be HOST:PORT"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_listen("h:99999", "ctx"), doctest::Contains("must be 0-65535"), ConfigError);
    CHECK_THROWS_WITH_AS(parse_listen("::1:80", "ctx"), doctest::Contains("IPv6 in brackets"), ConfigError);
}

TEST_CASE("a public listen address needs an API key or an explicit opt-in") {
    CHECK(error_of("[server]\nlisten = \"0.0.0.0:8800\"\n").find("is not a loopback address and no API key") !=
          std::string::npos);
    CHECK(error_of("[server]\nlisten = \"0.0.0.0:8800\"\napi_key = \"k\"\n").empty());
    CHECK(error_of("[server]\nlisten = \"0.0.0.0:8800\"\nallow_public_without_key = true\n").empty());
}

TEST_CASE("relative paths resolve against the config file's directory") {
    pulse::test::TempDir dir;
    auto f = dir.write("sub/pulse.toml", "[plugins]\ndirs = [\"plugins\"]\n[server]\ntrace_file = \"t.log\"\n");
    Config c = load_file(f);
    REQUIRE(c.plugins.dirs.size() == 1);
    CHECK(c.plugins.dirs[0] == std::filesystem::absolute(dir / "sub/plugins"));
    CHECK(c.server.trace_file == (std::filesystem::absolute(dir / "sub/t.log")).string());
}

TEST_CASE("a missing file is a clear error") {
    CHECK_THROWS_WITH_AS(load_file("/nonexistent/pulse.toml"), doctest::Contains("cannot read the config file"), ConfigError);
}

TEST_CASE("environment overrides used by existing deployments") {
    Config c = load_string(std::string(kMinimalModel) + "[models.other]\nprofile = \"llamacpp\"\n"
                                                        "[[models.other.endpoints]]\nurl = \"http://127.0.0.1:2/v1\"\n",
                           "t.toml");
    g_env = {{"PULSE_QWEN_BACKENDS", "spark=http://127.0.0.1:8888/v1,http://127.0.0.1:8889/v1"},
             {"PULSE_GATEWAY_API_KEY", "sekrit"},
             {"PULSE_GATEWAY_TRACE_FILE", "/tmp/trace.jsonl"},
             {"PULSE_GATEWAY_WARMUP_STATE_FILE", "/var/lib/pulse-gateway/warm.json"}};
    apply_env(c, fake_getenv);
    const Model* m = c.find_model("m");
    REQUIRE(m->endpoints.size() == 2);
    CHECK(m->endpoints[0].name == "spark");
    CHECK(m->endpoints[0].url == "http://127.0.0.1:8888/v1");
    CHECK(m->endpoints[1].name == "ep1");
    CHECK(m->endpoints[1].url == "http://127.0.0.1:8889/v1");
    CHECK(c.find_model("other")->endpoints[0].url == "http://127.0.0.1:2/v1");  // not a qwen38 model
    CHECK(c.server.api_key == "sekrit");
    CHECK(c.server.trace_file == "/tmp/trace.jsonl");
    CHECK(c.warmup.state_file == "/var/lib/pulse-gateway/warm.json");

    g_env = {{"PULSE_QWEN_BACKENDS", "spark=localhost:8888"}};
    CHECK_THROWS_WITH_AS(apply_env(c, fake_getenv), doctest::Contains("must be name=http://host:port/v1"), ConfigError);
    g_env = {{"PULSE_QWEN_BACKENDS", ",,"}};
    CHECK_THROWS_WITH_AS(apply_env(c, fake_getenv), doctest::Contains("lists no endpoint"), ConfigError);

    // It names the model it overrides: said in env_overrides, required once two models use qwen38.
    CHECK(c.env_overrides.front() == "PULSE_QWEN_BACKENDS: the endpoints of model 'm'");
    Config two = load_string(std::string(kMinimalModel) + "[models.demo]\nprofile = \"qwen38\"\n"
                                                          "[[models.demo.endpoints]]\nurl = \"http://127.0.0.1:3/v1\"\n",
                             "two.toml");
    g_env = {{"PULSE_QWEN_BACKENDS", "spark1=http://10.0.0.1:8888/v1"}};
    CHECK_THROWS_WITH_AS(apply_env(two, fake_getenv), doctest::Contains("names no model and 2 models use profile \"qwen38\" (m, demo)"),
                         ConfigError);
    g_env = {{"PULSE_QWEN_BACKENDS", "m: spark1=http://10.0.0.1:8888/v1, spark2=http://10.0.0.2:8888/v1"}};
    apply_env(two, fake_getenv);
    REQUIRE(two.find_model("m")->endpoints.size() == 2);
    CHECK(two.find_model("m")->endpoints[1].name == "spark2");
    CHECK(two.find_model("m")->endpoints[1].url == "http://10.0.0.2:8888/v1");
    CHECK(two.find_model("demo")->endpoints[0].url == "http://127.0.0.1:3/v1");  // not named: untouched
    g_env = {{"PULSE_QWEN_BACKENDS", "qwen83: spark1=http://10.0.0.1:8888/v1"}};
    CHECK_THROWS_WITH_AS(apply_env(two, fake_getenv), doctest::Contains("names model 'qwen83', which is not a model on profile"),
                         ConfigError);
    g_env = {{"PULSE_QWEN_BACKENDS", "http://10.0.0.1:8888/v1"}};  // a bare URL is not a model name
    apply_env(c, fake_getenv);
    CHECK(c.find_model("m")->endpoints[0].url == "http://10.0.0.1:8888/v1");

    Config none = load_string("", "e.toml");
    g_env = {{"PULSE_QWEN_BACKENDS", "a=http://127.0.0.1:1/v1"}};
    CHECK_THROWS_WITH_AS(apply_env(none, fake_getenv), doctest::Contains("no model uses profile \"qwen38\""), ConfigError);

    g_env = {{"PULSE_PLUGIN_DIRS", "/a:/b/c"}};
    apply_env(none, fake_getenv);
    REQUIRE(none.plugins.dirs.size() == 2);
    CHECK(none.plugins.dirs[1] == "/b/c");
    g_env.clear();
}

TEST_CASE("an API key from the environment allows a public bind") {
    Config c = load_string("[server]\nlisten = \"0.0.0.0:8800\"\n", "t.toml");
    CHECK_THROWS_AS(validate(c), ConfigError);
    g_env = {{"PULSE_GATEWAY_API_KEY", "k"}};
    apply_env(c, fake_getenv);
    CHECK_NOTHROW(validate(c));
    g_env.clear();
}

TEST_CASE("endpoint fragments: added after the configured endpoints, replaced by name, deduplicated by url") {
    pulse::test::TempDir d;
    auto cfg_text = std::string(R"(
[upstream]
endpoint_fragments = "frags"
[models.a]
profile = "qwen38"
upstream_model = "served"
[[models.a.endpoints]]
name = "local"
url = "http://127.0.0.1:8888/v1"
[models.b]
profile = "qwen38"
[[models.b.endpoints]]
url = "http://127.0.0.1:7777/v1"
)");
    auto p = d.write("pulse.toml", cfg_text);
    Config none = load_file(p);
    apply_fragments(none);  // the directory does not exist: no fragments
    CHECK(none.models[0].endpoints.size() == 1);

    d.write("frags/1-spark.toml", "[[endpoints]]\nupstream_model = \"served\"\nname = \"spark\"\nurl = \"http://10.0.0.2:8888/v1\"\n"
                                  "[[endpoints]]\nupstream_model = \"served\"\nname = \"again\"\nurl = \"http://127.0.0.1:8888/v1\"\n");
    d.write("frags/2-local.toml", "[[endpoints]]\nupstream_model = \"served\"\nname = \"local\"\nurl = \"http://127.0.0.1:9999/v1\"\n");
    d.write("frags/3-other.toml", "[[endpoints]]\nupstream_model = \"nobody\"\nname = \"x\"\nurl = \"http://127.0.0.1:1/v1\"\n");
    Config c = load_file(p);
    CHECK(c.upstream.endpoint_fragments == d.path() / "frags");
    apply_fragments(c);
    const auto& eps = c.models[0].endpoints;
    REQUIRE(eps.size() == 2);
    CHECK(eps[0].name == "local");
    CHECK(eps[0].url == "http://127.0.0.1:9999/v1");  // same name: replaced in place
    CHECK(eps[1].name == "spark");                     // "again" had the url of one already there
    CHECK(c.models[1].endpoints.size() == 1);
    REQUIRE(c.warnings.size() == 1);
    CHECK(c.warnings[0].find("3-other.toml: endpoint 'x' is for upstream model 'nobody'") != std::string::npos);
}

TEST_CASE("endpoint fragments: malformed ones are errors naming the file") {
    pulse::test::TempDir d;
    auto p = d.write("pulse.toml", std::string("[upstream]\nendpoint_fragments = \"frags\"\n") + kMinimalModel);
    auto error = [&](const std::string& text) {
        d.write("frags/f.toml", text);
        Config c = load_file(p);
        try {
            apply_fragments(c);
        } catch (const ConfigError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK(error("[[endpoints]]\nname = \"n\"\nurl = \"http://h/v1\"\n").find("f.toml") != std::string::npos);
    CHECK(error("[[endpoints]]\nupstream_model = \"m\"\nname = \"n\"\nurl = \"ftp://h\"\n").find("must start with http://") != std::string::npos);
    CHECK(error("[[endpoints]]\nupstream_model = \"m\"\nname = \"n\"\nurl = \"http://h/v1\"\nweight = 2\n").find("weight") != std::string::npos);
    CHECK(error("[[endpoints]\n").find("f.toml:1") != std::string::npos);
}

TEST_CASE("decoder:///path endpoints become the decoder backend with options.model (relative to the config)") {
    pulse::test::TempDir d;
    auto p = d.write("pulse.toml", R"([models.demo]
profile = "qwen38"
[[models.demo.endpoints]]
url = "decoder://models/demo.gguf"
[models.demo.endpoints.options]
threads = 2
[[models.demo.endpoints]]
url = "decoder:///srv/x.gguf"
)");
    Config c = load_file(p);
    REQUIRE(c.models[0].endpoints.size() == 2);
    const auto& e = c.models[0].endpoints[0];
    CHECK(e.url == "plugin://decoder");
    CHECK(e.options_json == "{\"model\":\"" + (d.path() / "models/demo.gguf").string() + "\",\"threads\":2}");
    CHECK(c.models[0].endpoints[1].options_json == "{\"model\":\"/srv/x.gguf\"}");
    CHECK(error_of("[models.m]\nprofile = \"p\"\n[[models.m.endpoints]]\nurl = \"decoder://\"\n").find("names no model file") != std::string::npos);
    CHECK(error_of("[models.m]\nprofile = \"p\"\n[[models.m.endpoints]]\nurl = \"decoder:///a.gguf\"\n[models.m.endpoints.options]\nmodel = \"/b\"\n")
              .find("already names the model") != std::string::npos);
    // Regression: "model" anywhere in the options' text (a value, a nested key) was taken for
    // options.model, and the endpoint refused.
    Config nested = load_string("[models.m]\nprofile = \"p\"\n[[models.m.endpoints]]\nurl = \"decoder:///a.gguf\"\n"
                                "[models.m.endpoints.options]\nnote = \"model\"\ndraft = { model = \"/d.gguf\" }\n",
                                "nested.toml");
    CHECK(nested.models[0].endpoints[0].options_json == R"({"model":"/a.gguf","draft":{"model":"/d.gguf"},"note":"model"})");
}

TEST_CASE("plugin options reach the plugin as the JSON of their TOML (keys sorted, as TOML tables are)") {
    Config c = load_string("[models.m]\nprofile = \"p\"\n[models.m.profile_options]\nf = 0.1\ni = -3\nb = true\n"
                           "s = \"q\\\"\\u0001\"\na = [1, [2.5, \"x\"]]\nt = { u = {} }\n"
                           "[[models.m.endpoints]]\nurl = \"http://127.0.0.1:1/v1\"\n",
                           "types.toml");
    CHECK(c.models[0].profile_options_json == R"({"a":[1,[2.5,"x"]],"b":true,"f":0.1,"i":-3,"s":"q\"\u0001","t":{"u":{}}})");
}

TEST_CASE("models keep the order the file lists them in (the first is the default elsewhere)") {
    Config c = load_string("[models.zeta]\nprofile = \"p\"\n[[models.zeta.endpoints]]\nurl = \"http://127.0.0.1:1/v1\"\n"
                           "[models.alpha]\nprofile = \"p\"\n[[models.alpha.endpoints]]\nurl = \"http://127.0.0.1:2/v1\"\n",
                           "order.toml");
    REQUIRE(c.models.size() == 2);
    CHECK(c.models[0].id == "zeta");
    CHECK(c.models[1].id == "alpha");
}

TEST_CASE("routing: failover by default, round_robin or sticky; endpoint weights in range") {
    Config c = load_string(kMinimalModel, "test.toml");
    REQUIRE(c.models.size() == 1);
    CHECK(c.models[0].routing == Model::Routing::failover);
    CHECK(c.models[0].endpoints[0].weight == 1);
    c = load_string("[models.m]\nprofile = \"qwen38\"\nrouting = \"sticky\"\n[[models.m.endpoints]]\nurl = \"http://127.0.0.1:1/v1\"\n"
                    "weight = 2.5\n",
                    "test.toml");
    CHECK(c.models[0].routing == Model::Routing::sticky);
    CHECK(c.models[0].endpoints[0].weight == 2.5);
    CHECK(error_of("[models.m]\nprofile = \"qwen38\"\nrouting = \"random\"\n[[models.m.endpoints]]\nurl = \"http://x:1/v1\"\n")
              .find("test.toml:3:11: 'models.m.routing' must be \"failover\", \"round_robin\" or \"sticky\"") == 0);
    CHECK(error_of("[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"http://x:1/v1\"\nweight = 0\n")
              .find("'models.m.endpoints[0].weight' = 0 is out of range") != std::string::npos);
}

TEST_CASE("resume: on by default, a boolean that turns mid-stream resume off per model") {
    CHECK(load_string(kMinimalModel, "test.toml").models[0].resume);
    CHECK_FALSE(load_string("[models.m]\nprofile = \"qwen38\"\nresume = false\n[[models.m.endpoints]]\nurl = \"http://x:1/v1\"\n", "test.toml")
                    .models[0]
                    .resume);
    std::string e = error_of("[models.m]\nprofile = \"qwen38\"\nresume = \"no\"\n[[models.m.endpoints]]\nurl = \"http://x:1/v1\"\n");
    CAPTURE(e);
    CHECK(e.find("test.toml:3:") == 0);
    CHECK(e.find("models.m.resume") != std::string::npos);
}

TEST_CASE("last_resort endpoints: a flag; a model needs one endpoint that is not a last resort") {
    Config c = load_string(std::string(kMinimalModel) + "[[models.m.endpoints]]\nname = \"local\"\nurl = \"plugin://x\"\nlast_resort = true\n",
                           "test.toml");
    REQUIRE(c.models[0].endpoints.size() == 2);
    CHECK_FALSE(c.models[0].endpoints[0].last_resort);
    CHECK(c.models[0].endpoints[1].last_resort);
    CHECK(error_of("[models.m]\nprofile = \"qwen38\"\n[[models.m.endpoints]]\nurl = \"plugin://x\"\nlast_resort = true\n")
              .find("model 'm': every endpoint is last_resort; at least one must serve normally") != std::string::npos);
}
