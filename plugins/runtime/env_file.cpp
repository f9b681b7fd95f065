#include "env_file.h"

#include <set>

namespace pulse::runtime {
namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

[[noreturn]] void fail(const std::string& name, int line, const std::string& msg) {
    throw EnvError(name + ":" + std::to_string(line) + ": " + msg);
}

// Parses the value after `KEY=` up to an unquoted `#` comment or the end of the line.
std::string parse_value(std::string_view s, const std::string& name, int line, const std::string& key) {
    std::string out;
    size_t i = 0;
    auto expansion = [&](char c) {
        fail(name, line, key + ": '" + std::string(1, c) +
                             "' would be expanded by bash; profiles hold literal values (quote it as '...')");
    };
    while (i < s.size()) {
        char c = s[i];
        if (c == '\'') {
            size_t close = s.find('\'', i + 1);
            if (close == std::string_view::npos) fail(name, line, key + ": unterminated single quote");
            out.append(s.substr(i + 1, close - i - 1));
            i = close + 1;
        } else if (c == '"') {
            ++i;
            bool closed = false;
            while (i < s.size()) {
                char d = s[i];
                if (d == '"') {
                    closed = true;
                    ++i;
                    break;
                }
                if (d == '\\' && i + 1 < s.size() && std::string_view("\"\\$`").find(s[i + 1]) != std::string_view::npos) {
                    out += s[i + 1];
                    i += 2;
                    continue;
                }
                if (d == '$' || d == '`') expansion(d);
                out += d;
                ++i;
            }
            if (!closed) fail(name, line, key + ": unterminated double quote");
        } else if (c == ' ' || c == '\t') {
            std::string_view rest = trim(s.substr(i));
            if (!rest.empty() && rest.front() != '#')
                fail(name, line, key + ": unquoted space in the value; quote it as '...'");
            break;
        } else if (c == '#' && out.empty() && i == 0) {
            break;  // KEY=#comment: an empty value, as in bash
        } else if (c == '\\') {
            if (i + 1 >= s.size()) fail(name, line, key + ": line continuation is not supported");
            out += s[i + 1];
            i += 2;
        } else if (c == '$' || c == '`') {
            expansion(c);
        } else if (std::string_view(";&|<>(){}").find(c) != std::string_view::npos) {
            fail(name, line, key + ": '" + std::string(1, c) + "' is shell syntax; quote the value as '...'");
        } else {
            out += c;
            ++i;
        }
    }
    return out;
}

}  // namespace

bool valid_key(std::string_view key) {
    if (key.empty() || (key[0] >= '0' && key[0] <= '9')) return false;
    for (char c : key)
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
    return true;
}

const EnvEntry* EnvFile::find(std::string_view key) const {
    for (const auto& e : entries)
        if (e.key == key) return &e;
    return nullptr;
}

std::vector<std::string> EnvFile::meta_all(std::string_view key) const {
    std::vector<std::string> out;
    for (const auto& [k, v] : meta)
        if (k == key) out.push_back(v);
    return out;
}

EnvFile parse_env(std::string_view text, const std::string& name) {
    EnvFile f;
    f.name = name;
    std::set<std::string> seen;
    int line_no = 0;
    bool in_header = true;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t nl = text.find('\n', pos);
        std::string_view raw = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
        ++line_no;
        std::string_view line = trim(raw);
        if (line.empty()) continue;
        if (line.front() == '#') {
            if (line.rfind("#@", 0) == 0) {
                std::string_view m = trim(line.substr(2));
                auto colon = m.find(':');
                if (colon == std::string_view::npos || colon == 0)
                    fail(name, line_no, "metadata must look like '#@ key: value'");
                f.meta.emplace_back(std::string(trim(m.substr(0, colon))), std::string(trim(m.substr(colon + 1))));
            } else if (in_header) {
                std::string_view c = line.substr(1);
                if (!c.empty() && c.front() == ' ') c.remove_prefix(1);
                f.header.emplace_back(c);
            }
            continue;
        }
        in_header = false;
        if (line.rfind("export ", 0) == 0) line = trim(line.substr(7));
        auto eq = line.find('=');
        if (eq == std::string_view::npos) fail(name, line_no, "expected KEY=value");
        std::string key(line.substr(0, eq));
        if (!valid_key(key)) fail(name, line_no, "'" + key + "' is not a valid variable name");
        if (!seen.insert(key).second) fail(name, line_no, key + " is set twice");
        f.entries.push_back({key, parse_value(line.substr(eq + 1), name, line_no, key), line_no});
    }
    return f;
}

std::vector<std::string> sample_keys(std::string_view text) {
    std::vector<std::string> keys;
    std::set<std::string> seen;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        std::string_view line = trim(text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos));
        pos = nl == std::string_view::npos ? text.size() : nl + 1;
        if (!line.empty() && line.front() == '#') line = trim(line.substr(1));
        if (line.rfind("export ", 0) == 0) line = trim(line.substr(7));
        auto eq = line.find('=');
        if (eq == std::string_view::npos) continue;
        std::string key(line.substr(0, eq));
        if (!valid_key(key) || key.find_first_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos) continue;
        if (seen.insert(key).second) keys.push_back(key);
    }
    return keys;
}

std::string shell_quote(std::string_view value) {
    std::string out = "'";
    for (char c : value) {
        if (c == '\'') out += "'\\''";
        else out += c;
    }
    return out + "'";
}

}  // namespace pulse::runtime
