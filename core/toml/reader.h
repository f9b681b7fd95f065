// How Pulse reads a TOML file it owns (the gateway config and its fragments, the controller's
// nodes file, the runtime profiles' runtime.toml): toml++, one reader, one error format.
//
//   FILE:LINE:COLUMN: 'table.key' must be an integer, found a string
//   FILE:LINE:COLUMN: 'server.listen' = 70000 is out of range; allowed 1 to 65535
//   FILE:LINE:COLUMN: unknown key 'server.threds' (did you mean 'threads'?); allowed here: a, b, c
//
// Every problem names where it is, the key with its table path, what is wrong and what is
// allowed. A file's problems are either thrown at the first (the gateway's config: it refuses
// to start or to reload) or collected and reported together (a command that checks a file).
// A library the host and the runtime controller plugin both link.
#pragma once

#include <toml++/toml.h>

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pulse::toml_reader {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// "FILE:LINE:COLUMN"
std::string where(const std::string& file, const toml::source_region& r);

// Parses a file; a syntax error is "FILE:LINE:COLUMN: what toml++ says", a missing file
// "FILE: file not found" followed by `missing_hint` when given.
toml::table parse_file(const std::filesystem::path& path, const std::string& missing_hint = {});
// The same for text, `name` standing for the file in messages.
toml::table parse_string(std::string_view text, const std::string& name);

// The problems found in one file.
class Problems {
public:
    enum class Mode { throw_first, collect };
    Problems(std::string file, Mode mode) : file_(std::move(file)), mode_(mode) {}

    const std::string& file() const { return file_; }
    // Throws Error in throw_first mode; returns otherwise.
    void add(const toml::source_region& at, const std::string& what);
    void add(const std::string& what);  // about the file as a whole
    bool empty() const { return list_.empty(); }
    const std::vector<std::string>& list() const { return list_; }
    // Every problem, one a line; throws them as one Error when there are any.
    void throw_if_any() const;

private:
    std::string file_;
    Mode mode_;
    std::vector<std::string> list_;
};

// Walks one table: each accessor takes a key (records it as allowed here) and reads it if
// present, with its type and range checked; reject_unknown() then names any key not taken.
// An accessor returns whether it set `out`.
class Table {
public:
    Table(const toml::table& t, std::string path, Problems& problems) : t_(t), path_(std::move(path)), problems_(problems) {}

    std::string qualified(std::string_view key) const;

    void fail(const toml::node& n, const std::string& what) const { problems_.add(n.source(), what); }
    void fail_here(const std::string& what) const { problems_.add(t_.source(), what); }

    const toml::node* take(std::string_view key);
    bool str(std::string_view key, std::string& out);
    bool boolean(std::string_view key, bool& out);
    bool integer(std::string_view key, int64_t& out, int64_t lo, int64_t hi);
    bool integer(std::string_view key, std::optional<int64_t>& out, int64_t lo, int64_t hi);
    bool number(std::string_view key, double& out, double lo, double hi);
    bool number(std::string_view key, std::optional<double>& out, double lo, double hi);
    bool strings(std::string_view key, std::vector<std::string>& out);
    const toml::table* subtable(std::string_view key);
    const toml::array* array(std::string_view key);
    // Call once every key has been taken.
    void reject_unknown() const;

    static std::string type_name(const toml::node& n);

private:
    // An optional setting read with `read`, which sets a plain value.
    template <class T, class Read>
    static bool into_optional(std::optional<T>& out, Read read) {
        T v{};
        if (!read(v)) return false;
        out = v;
        return true;
    }

    const toml::table& t_;
    std::string path_;
    Problems& problems_;
    std::vector<std::string> allowed_;
};

// A TOML value as JSON text (plugins take their options as JSON). Dates and times, and
// non-finite floats, have no JSON form: a problem at their place, and null written.
std::string to_json(const toml::node& n, Problems& problems);

}  // namespace pulse::toml_reader
