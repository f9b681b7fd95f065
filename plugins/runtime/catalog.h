// Runtime families and their profiles, loaded from a profiles directory:
//
//   profiles/FAMILY/runtime.toml   what the family's recipe reads: the key schema (type,
//                                  required, range, choices) and how to verify a server
//   profiles/FAMILY/NAME.env       one profile: a complete key set, plus `#@` metadata
//
// Everything is validated on load; errors name the file, the line or key, and what is allowed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

#include "env_file.h"

namespace pulse::runtime {

enum class KeyType { string, integer, boolean, path, json, choice };

struct KeySpec {
    std::string name;
    KeyType type = KeyType::string;
    bool required = false;       // must be present and non-empty
    bool in_sample = true;       // false: read by the recipe's scripts but not in .env.sample
    std::optional<int64_t> min, max;
    std::vector<std::string> choices;
    std::string doc;
};

struct Family {
    std::string name;
    std::filesystem::path dir;
    std::string description;
    std::string start_command = "./start.sh";
    std::string stop_command = "./stop.sh";
    std::string port_key = "PORT";
    std::string served_model_key;
    std::vector<std::string> max_model_len_keys;  // first non-empty wins
    // Shell commands run on the node in the recipe dir with its .env sourced.
    std::string log_command;       // prints the server log
    std::string own_pids_command;  // pids of this recipe's server (allowed on the GPU)
    std::string kv_cache_pattern;  // regex; group 1 = KV cache size in tokens
    std::vector<std::string> proofs;  // regexes every server of this family must log
    std::vector<KeySpec> keys;

    const KeySpec* key(std::string_view name) const;
};

struct Profile {
    std::string name;   // file stem
    const Family* family = nullptr;
    std::filesystem::path file;
    EnvFile env;
    std::string description;
    std::string render_only;        // non-empty: why `up` refuses it
    std::vector<std::string> proofs;  // regexes, ${KEY} replaced by the (escaped) value

    std::string value(std::string_view key) const;  // "" when absent
    std::string qualified() const { return family->name + "/" + name; }
};

class CatalogError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class Catalog {
public:
    // Loads every family under `dir`. Throws CatalogError listing every problem found.
    static Catalog load(const std::filesystem::path& dir);

    // "best" or "qwen38/best". Throws CatalogError (unknown, or ambiguous across families).
    const Profile& find(std::string_view name) const;
    const std::vector<std::unique_ptr<Family>>& families() const { return families_; }
    const std::vector<Profile>& profiles() const { return profiles_; }

private:
    std::vector<std::unique_ptr<Family>> families_;
    std::vector<Profile> profiles_;
};

// Site paths a profile names as {{name}} (e.g. the MTP head shard), replaced from the node's
// [paths] table. Returns the names that were not found (the value keeps them literally).
std::vector<std::string> substitute_paths(std::string& value, const std::map<std::string, std::string>& paths);

// The rendered .env for `profile` with site paths from `paths` (empty: left as {{name}}).
struct Rendered {
    std::string text;
    std::vector<std::pair<std::string, std::string>> values;  // key, final value
    std::vector<std::string> unresolved;                      // "KEY: {{name}}"
    std::string get(std::string_view key) const;
};
Rendered render(const Profile& profile, const std::map<std::string, std::string>& paths, const std::string& origin);

// A profile's proof regex with each ${KEY} replaced by the key's value, regex-escaped. A key
// without a value is reported through `missing` (when given) and replaced by nothing.
std::string expand_proof(const std::string& proof, const std::vector<std::pair<std::string, std::string>>& values,
                         std::string* missing = nullptr);

// Type/range checks of final values (after substitution). Returns one message per problem.
std::vector<std::string> check_values(const Profile& profile, const Rendered& r);

}  // namespace pulse::runtime
