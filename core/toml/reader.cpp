#include "toml/reader.h"

#include <pulse/plugin.hpp>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cmath>
#include <sstream>

namespace pulse::toml_reader {

std::string where(const std::string& file, const toml::source_region& r) {
    return file + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

toml::table parse_file(const std::filesystem::path& path, const std::string& missing_hint) {
    const std::string file = path.string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw Error(file + ": file not found" + (missing_hint.empty() ? "" : " (" + missing_hint + ")"));
    try {
        return toml::parse_file(file);
    } catch (const toml::parse_error& e) {
        throw Error(where(file, e.source()) + ": " + std::string(e.description()));
    }
}

toml::table parse_string(std::string_view text, const std::string& name) {
    try {
        return toml::parse(text, name);
    } catch (const toml::parse_error& e) {
        throw Error(where(name, e.source()) + ": " + std::string(e.description()));
    }
}

void Problems::add(const toml::source_region& at, const std::string& what) {
    const std::string line = where(at.path ? *at.path : file_, at) + ": " + what;
    if (mode_ == Mode::throw_first) throw Error(line);
    list_.push_back(line);
}

void Problems::add(const std::string& what) {
    const std::string line = file_ + ": " + what;
    if (mode_ == Mode::throw_first) throw Error(line);
    list_.push_back(line);
}

void Problems::throw_if_any() const {
    if (list_.empty()) return;
    std::string all;
    for (const auto& p : list_) all += (all.empty() ? "" : "\n") + p;
    throw Error(all);
}

std::string Table::qualified(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }

const toml::node* Table::take(std::string_view key) {
    allowed_.emplace_back(key);
    return t_.get(key);
}

bool Table::str(std::string_view key, std::string& out) {
    const toml::node* n = take(key);
    if (!n) return false;
    if (!n->is_string()) return fail(*n, "'" + qualified(key) + "' must be a string, found " + type_name(*n)), false;
    out = n->as_string()->get();
    return true;
}

bool Table::boolean(std::string_view key, bool& out) {
    const toml::node* n = take(key);
    if (!n) return false;
    if (!n->is_boolean()) return fail(*n, "'" + qualified(key) + "' must be true or false, found " + type_name(*n)), false;
    out = n->as_boolean()->get();
    return true;
}

bool Table::integer(std::string_view key, int64_t& out, int64_t lo, int64_t hi) {
    const toml::node* n = take(key);
    if (!n) return false;
    if (!n->is_integer()) return fail(*n, "'" + qualified(key) + "' must be an integer, found " + type_name(*n)), false;
    const int64_t v = n->as_integer()->get();
    if (v < lo || v > hi)
        return fail(*n, "'" + qualified(key) + "' = " + std::to_string(v) + " is out of range; allowed " + std::to_string(lo) + " to " +
                            std::to_string(hi)),
               false;
    out = v;
    return true;
}

bool Table::integer(std::string_view key, std::optional<int64_t>& out, int64_t lo, int64_t hi) {
    return into_optional<int64_t>(out, [&](int64_t& v) { return integer(key, v, lo, hi); });
}

bool Table::number(std::string_view key, double& out, double lo, double hi) {
    const toml::node* n = take(key);
    if (!n) return false;
    double v = 0;
    if (n->is_integer()) v = static_cast<double>(n->as_integer()->get());
    else if (n->is_floating_point()) v = n->as_floating_point()->get();
    else return fail(*n, "'" + qualified(key) + "' must be a number, found " + type_name(*n)), false;
    if (!(v >= lo && v <= hi)) {
        std::ostringstream o;
        o << "'" << qualified(key) << "' = " << v << " is out of range; allowed " << lo << " to " << hi;
        return fail(*n, o.str()), false;
    }
    out = v;
    return true;
}

bool Table::number(std::string_view key, std::optional<double>& out, double lo, double hi) {
    return into_optional<double>(out, [&](double& v) { return number(key, v, lo, hi); });
}

bool Table::strings(std::string_view key, std::vector<std::string>& out) {
    const toml::node* n = take(key);
    if (!n) return false;
    const toml::array* a = n->as_array();
    if (!a) return fail(*n, "'" + qualified(key) + "' must be an array of strings, found " + type_name(*n)), false;
    std::vector<std::string> read;
    for (const auto& e : *a) {
        if (!e.is_string()) return fail(e, "'" + qualified(key) + "' must contain only strings, found " + type_name(e)), false;
        read.push_back(e.as_string()->get());
    }
    out = std::move(read);
    return true;
}

const toml::table* Table::subtable(std::string_view key) {
    const toml::node* n = take(key);
    if (!n) return nullptr;
    if (!n->is_table()) return fail(*n, "'" + qualified(key) + "' must be a table, found " + type_name(*n)), nullptr;
    return n->as_table();
}

const toml::array* Table::array(std::string_view key) {
    const toml::node* n = take(key);
    if (!n) return nullptr;
    if (!n->is_array()) return fail(*n, "'" + qualified(key) + "' must be an array, found " + type_name(*n)), nullptr;
    return n->as_array();
}

void Table::reject_unknown() const {
    for (const auto& [k, v] : t_) {
        bool known = false;
        for (const auto& a : allowed_) known = known || a == k.str();
        if (known) continue;
        std::string list;
        for (const auto& a : allowed_) list += (list.empty() ? "" : ", ") + a;
        problems_.add(k.source(), "unknown key '" + qualified(k.str()) + "'" + pulse::did_you_mean(k.str(), allowed_) + "; allowed here: " +
                                      (list.empty() ? "none" : list));
    }
}

std::string Table::type_name(const toml::node& n) {
    switch (n.type()) {
        case toml::node_type::string: return "a string";
        case toml::node_type::integer: return "an integer";
        case toml::node_type::floating_point: return "a float";
        case toml::node_type::boolean: return "a boolean";
        case toml::node_type::array: return "an array";
        case toml::node_type::table: return "a table";
        default: return "a date/time";
    }
}

namespace {

void write_json(const toml::node& n, rapidjson::Writer<rapidjson::StringBuffer>& w, Problems& problems) {
    if (auto* t = n.as_table()) {
        w.StartObject();
        for (const auto& [k, v] : *t) {
            w.Key(k.data(), static_cast<rapidjson::SizeType>(k.length()));
            write_json(v, w, problems);
        }
        w.EndObject();
    } else if (auto* a = n.as_array()) {
        w.StartArray();
        for (const auto& v : *a) write_json(v, w, problems);
        w.EndArray();
    } else if (auto* s = n.as_string()) {
        w.String(s->get().data(), static_cast<rapidjson::SizeType>(s->get().size()));
    } else if (auto* i = n.as_integer()) {
        w.Int64(i->get());
    } else if (auto* f = n.as_floating_point()) {
        if (std::isfinite(f->get())) w.Double(f->get());
        else problems.add(n.source(), "non-finite numbers cannot be passed to plugins"), w.Null();
    } else if (auto* b = n.as_boolean()) {
        w.Bool(b->get());
    } else {
        problems.add(n.source(), "dates and times cannot be passed to plugins; use a string");
        w.Null();
    }
}

}  // namespace

std::string to_json(const toml::node& n, Problems& problems) {
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    write_json(n, w, problems);
    return {b.GetString(), b.GetSize()};
}

}  // namespace pulse::toml_reader
