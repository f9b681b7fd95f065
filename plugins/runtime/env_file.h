// The bash-sourced `KEY=value` files runtime recipes read (.env, .env.sample, profiles).
//
// Parsing accepts what such files hold in practice: comments, blank lines, `export KEY=...`,
// and values made of 'single-quoted', "double-quoted" (escapes \" \\ \$ \`) and bare segments.
// Anything that bash would expand ($VAR, $(cmd), `cmd`) is rejected: a profile is data, and a
// value must mean the same when Pulse reads it as when the recipe sources it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pulse::runtime {

// "FILE:LINE: problem".
class EnvError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct EnvEntry {
    std::string key;
    std::string value;
    int line = 0;
};

struct EnvFile {
    std::string name;                    // for messages (usually the path)
    std::vector<EnvEntry> entries;       // in file order; a key appears once
    // `#@ key: value` lines: machine-readable metadata (description, proof, render-only).
    std::vector<std::pair<std::string, std::string>> meta;
    // The leading comment block, without the `#` and without the `#@` lines.
    std::vector<std::string> header;

    const EnvEntry* find(std::string_view key) const;
    std::vector<std::string> meta_all(std::string_view key) const;
};

// Throws EnvError naming the line for syntax errors and keys given twice.
EnvFile parse_env(std::string_view text, const std::string& name);

// Keys a recipe's .env.sample names, including commented-out `#KEY=value` lines (samples list
// optional keys that way). Lenient: lines that are not assignments are skipped.
std::vector<std::string> sample_keys(std::string_view text);

// 'value' with ' written as '\'' : bash reads it back byte for byte.
std::string shell_quote(std::string_view value);

bool valid_key(std::string_view key);

}  // namespace pulse::runtime
