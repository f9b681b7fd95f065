#include "catalog.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include <rapidjson/document.h>
#include <toml++/toml.h>

#include <climits>

#include "toml/reader.h"

namespace pulse::runtime {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw CatalogError(p.string() + ": cannot read");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// Reads one family's runtime.toml; problems are appended to `errors`.
// One [keys.NAME] table of a runtime.toml: what a recipe's key holds and allows. Nothing when
// it is not a table or not a valid name (reported to `problems`).
std::optional<KeySpec> read_key_spec(std::string name, const toml::node& v, toml_reader::Problems& problems) {
    KeySpec spec;
    spec.name = std::move(name);
    const std::string at = "keys." + spec.name;
    const toml::table* kt = v.as_table();
    if (!kt || !valid_key(spec.name)) {
        problems.add(v.source(), "'" + at + "' must be a table and a valid variable name");
        return std::nullopt;
    }
    toml_reader::Table t(*kt, at, problems);
    std::string type = "string";
    t.str("type", type);
    static const std::map<std::string, KeyType> types = {{"string", KeyType::string}, {"int", KeyType::integer},
                                                         {"bool", KeyType::boolean}, {"path", KeyType::path},
                                                         {"json", KeyType::json},     {"choice", KeyType::choice}};
    if (auto it = types.find(type); it != types.end()) spec.type = it->second;
    else t.fail(*kt->get("type"), "'" + at + ".type' = '" + type + "' is not one of string, int, bool, path, json, choice");
    t.boolean("required", spec.required);
    t.boolean("sample", spec.in_sample);
    int64_t bound = 0;
    if (t.integer("min", bound, INT64_MIN, INT64_MAX)) spec.min = bound;
    if (t.integer("max", bound, INT64_MIN, INT64_MAX)) spec.max = bound;
    t.str("doc", spec.doc);
    t.strings("choices", spec.choices);
    t.reject_unknown();
    if (spec.type == KeyType::choice && spec.choices.empty()) t.fail_here("'" + at + "': type \"choice\" needs choices = [...]");
    return spec;
}

std::unique_ptr<Family> load_family(const fs::path& dir, std::vector<std::string>& errors) {
    auto fam = std::make_unique<Family>();
    fam->name = dir.filename().string();
    fam->dir = dir;
    const std::string file = (dir / "runtime.toml").string();
    toml::table root;
    try {
        root = toml_reader::parse_file(file);
    } catch (const toml_reader::Error& e) {
        errors.push_back(e.what());
        return nullptr;
    }
    toml_reader::Problems problems(file, toml_reader::Problems::Mode::collect);
    toml_reader::Table top(root, "", problems);
    auto required = [&](const char* key, std::string& out) {
        if (!top.str(key, out) && !root.contains(key)) problems.add("'" + std::string(key) + "' is required");
    };
    required("description", fam->description);
    top.str("start_command", fam->start_command);
    top.str("stop_command", fam->stop_command);
    top.str("port_key", fam->port_key);
    required("served_model_key", fam->served_model_key);
    required("log_command", fam->log_command);
    top.str("own_pids_command", fam->own_pids_command);
    required("kv_cache_pattern", fam->kv_cache_pattern);
    top.strings("max_model_len_keys", fam->max_model_len_keys);
    top.strings("proof", fam->proofs);
    for (const auto& p : fam->proofs) {
        try {
            std::regex re(p);
        } catch (const std::regex_error& e) {
            problems.add("proof '" + p + "' is not a valid regex: " + e.what());
        }
    }
    if (!fam->kv_cache_pattern.empty()) {
        try {
            std::regex re(fam->kv_cache_pattern);
            if (re.mark_count() < 1) problems.add("kv_cache_pattern needs a group capturing the token count");
        } catch (const std::regex_error& e) {
            problems.add(std::string("kv_cache_pattern is not a valid regex: ") + e.what());
        }
    }
    const toml::table* keys = top.subtable("keys");
    top.reject_unknown();
    if (!keys) problems.add("[keys.NAME] tables are required (the recipe's key schema)");
    static const toml::table none;
    for (const auto& [k, v] : keys ? *keys : none) {
        if (auto spec = read_key_spec(std::string(k.str()), v, problems)) fam->keys.push_back(std::move(*spec));
    }
    for (const std::string* k : {&fam->port_key, &fam->served_model_key})
        if (!k->empty() && !fam->key(*k)) problems.add("'" + *k + "' is not in [keys]");
    for (const auto& k : fam->max_model_len_keys)
        if (!fam->key(k)) problems.add("max_model_len_keys: '" + k + "' is not in [keys]");
    errors.insert(errors.end(), problems.list().begin(), problems.list().end());
    return fam;
}

std::string regex_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) o += '\\';
        o += c;
    }
    return o;
}

bool has_placeholder(std::string_view v) { return v.find("{{") != std::string_view::npos; }

// Type and range check of one value; "" = fine.
std::string check_value(const KeySpec& spec, const std::string& v) {
    if (v.empty()) return spec.required ? "is required and empty" : "";
    switch (spec.type) {
        case KeyType::string: return "";
        case KeyType::integer: {
            size_t i = v[0] == '-' ? 1 : 0;
            if (i == v.size() || v.size() > 19 || v.find_first_not_of("0123456789", i) != std::string::npos)
                return "'" + v + "' is not an integer";
            int64_t x = std::stoll(v);
            if ((spec.min && x < *spec.min) || (spec.max && x > *spec.max))
                return "= " + v + " is out of range; allowed " + (spec.min ? std::to_string(*spec.min) : "-inf") + " to " +
                       (spec.max ? std::to_string(*spec.max) : "inf");
            return "";
        }
        case KeyType::boolean:
            return v == "0" || v == "1" || v == "true" || v == "false" ? "" : "'" + v + "' is not a bool (0, 1, true, false)";
        case KeyType::path:
            if (has_placeholder(v)) return "";
            return v[0] == '/' ? "" : "'" + v + "' must be an absolute path";
        case KeyType::json: {
            rapidjson::Document d;
            d.Parse(v.c_str(), v.size());
            if (d.HasParseError() || !(d.IsObject() || d.IsArray())) return "'" + v + "' is not a JSON object or array";
            return "";
        }
        case KeyType::choice:
            if (std::find(spec.choices.begin(), spec.choices.end(), v) != spec.choices.end()) return "";
            {
                std::string list;
                for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + c;
                return "'" + v + "' is not one of " + list;
            }
    }
    return "";
}

void load_profile(const Family& fam, const fs::path& file, std::vector<Profile>& out, std::vector<std::string>& errors) {
    Profile p;
    p.name = file.stem().string();
    p.family = &fam;
    p.file = file;
    try {
        p.env = parse_env(read_file(file), file.string());
    } catch (const std::exception& e) {
        errors.push_back(e.what());
        return;
    }
    const std::string f = file.string();
    size_t before = errors.size();
    for (const auto& [k, v] : p.env.meta) {
        if (k == "description") p.description = v;
        else if (k == "proof") p.proofs.push_back(v);
        else if (k == "render-only") p.render_only = v.empty() ? "marked render-only" : v;
        else errors.push_back(f + ": unknown metadata '#@ " + k + ":'; allowed: description, proof, render-only");
    }
    if (p.description.empty()) errors.push_back(f + ": '#@ description: ...' is required (one line for `pulse model profiles`)");
    for (const auto& e : p.env.entries) {
        const KeySpec* spec = fam.key(e.key);
        if (!spec) {
            errors.push_back(f + ":" + std::to_string(e.line) + ": unknown key " + e.key + " for runtime family " + fam.name +
                             " (" + (fam.dir / "runtime.toml").string() + " lists the keys)");
            continue;
        }
        if (std::string m = check_value(*spec, e.value); !m.empty())
            errors.push_back(f + ":" + std::to_string(e.line) + ": " + e.key + " " + m);
    }
    for (const auto& spec : fam.keys)
        if (spec.required && !p.env.find(spec.name)) errors.push_back(f + ": required key " + spec.name + " is missing");
    for (const auto& pr : p.proofs) {
        std::vector<std::pair<std::string, std::string>> values;
        for (const auto& e : p.env.entries) values.emplace_back(e.key, e.value);
        std::string missing;
        std::string expanded = expand_proof(pr, values, &missing);
        if (!missing.empty()) errors.push_back(f + ": proof '" + pr + "' names ${" + missing + "}, which the profile does not set");
        try {
            std::regex re(expanded);
        } catch (const std::regex_error& e) {
            errors.push_back(f + ": proof '" + pr + "' is not a valid regex: " + e.what());
        }
    }
    if (errors.size() == before) out.push_back(std::move(p));
}

}  // namespace

std::string expand_proof(const std::string& proof, const std::vector<std::pair<std::string, std::string>>& values,
                         std::string* missing) {
    std::string o;
    size_t pos = 0;
    while (true) {
        size_t open = proof.find("${", pos);
        size_t close = open == std::string::npos ? std::string::npos : proof.find('}', open);
        if (close == std::string::npos) break;
        o.append(proof, pos, open - pos);
        std::string key = proof.substr(open + 2, close - open - 2);
        auto it = std::find_if(values.begin(), values.end(), [&](const auto& kv) { return kv.first == key; });
        if (it != values.end()) o += regex_escape(it->second);
        else if (missing) *missing = key;
        pos = close + 1;
    }
    return o + proof.substr(pos);
}

const KeySpec* Family::key(std::string_view n) const {
    for (const auto& k : keys)
        if (k.name == n) return &k;
    return nullptr;
}

std::string Profile::value(std::string_view key) const {
    const EnvEntry* e = env.find(key);
    return e ? e->value : std::string();
}

Catalog Catalog::load(const fs::path& dir) {
    Catalog c;
    std::vector<std::string> errors;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw CatalogError(dir.string() + ": profiles directory not found");
    std::vector<fs::path> fams;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.is_directory() && fs::exists(e.path() / "runtime.toml")) fams.push_back(e.path());
    std::sort(fams.begin(), fams.end());
    for (const auto& d : fams) {
        auto fam = load_family(d, errors);
        if (!fam) continue;
        std::vector<fs::path> files;
        for (const auto& e : fs::directory_iterator(d, ec))
            if (e.path().extension() == ".env" && e.is_regular_file()) files.push_back(e.path());
        std::sort(files.begin(), files.end());
        for (const auto& f : files) load_profile(*fam, f, c.profiles_, errors);
        c.families_.push_back(std::move(fam));
    }
    if (!errors.empty()) {
        std::string msg;
        for (const auto& e : errors) msg += (msg.empty() ? "" : "\n") + e;
        throw CatalogError(msg);
    }
    return c;
}

const Profile& Catalog::find(std::string_view name) const {
    std::string fam, prof(name);
    if (auto slash = name.find('/'); slash != std::string_view::npos) {
        fam = std::string(name.substr(0, slash));
        prof = std::string(name.substr(slash + 1));
    }
    const Profile* hit = nullptr;
    for (const auto& p : profiles_) {
        if (p.name != prof || (!fam.empty() && p.family->name != fam)) continue;
        if (hit) throw CatalogError("profile '" + std::string(name) + "' is ambiguous: " + hit->qualified() + " and " +
                                    p.qualified() + "; name it as FAMILY/PROFILE");
        hit = &p;
    }
    if (!hit) {
        std::string list;
        for (const auto& p : profiles_) list += (list.empty() ? "" : ", ") + p.qualified();
        throw CatalogError("no profile '" + std::string(name) + "'; available: " + (list.empty() ? "(none)" : list));
    }
    return *hit;
}

std::vector<std::string> substitute_paths(std::string& value, const std::map<std::string, std::string>& paths) {
    std::vector<std::string> missing;
    std::string out;
    size_t pos = 0;
    while (true) {
        size_t open = value.find("{{", pos);
        size_t close = open == std::string::npos ? std::string::npos : value.find("}}", open + 2);
        if (close == std::string::npos) {
            out.append(value, pos, std::string::npos);
            break;
        }
        out.append(value, pos, open - pos);
        std::string name = value.substr(open + 2, close - open - 2);
        if (auto it = paths.find(name); it != paths.end()) out += it->second;
        else {
            missing.push_back(name);
            out.append(value, open, close + 2 - open);
        }
        pos = close + 2;
    }
    value = out;
    return missing;
}

std::string Rendered::get(std::string_view key) const {
    for (const auto& [k, v] : values)
        if (k == key) return v;
    return {};
}

Rendered render(const Profile& profile, const std::map<std::string, std::string>& paths, const std::string& origin) {
    Rendered r;
    std::string& t = r.text;
    t += "# Written by Pulse: " + origin + "\n";
    t += "# Profile " + profile.qualified() + " (" + profile.file.string() + "): " + profile.description + "\n";
    for (const auto& h : profile.env.header) t += "#   " + h + "\n";
    for (const auto& e : profile.env.entries) {
        std::string v = e.value;
        for (const auto& m : substitute_paths(v, paths)) r.unresolved.push_back(e.key + ": {{" + m + "}}");
        r.values.emplace_back(e.key, v);
        t += e.key + "=" + shell_quote(v) + "\n";
    }
    return r;
}

std::vector<std::string> check_values(const Profile& profile, const Rendered& r) {
    std::vector<std::string> out;
    for (const auto& [k, v] : r.values)
        if (const KeySpec* spec = profile.family->key(k))
            if (std::string m = check_value(*spec, v); !m.empty()) out.push_back(profile.file.string() + ": " + k + " " + m);
    return out;
}

}  // namespace pulse::runtime
