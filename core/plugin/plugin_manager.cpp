#include "plugin/plugin_manager.h"

#include <elf.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <vector>
#include <sstream>

#include <Poco/DigestEngine.h>
#include <Poco/SHA2Engine.h>
#include <boost/dll/library_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "common/log.h"
#include "common/metric_defs.h"
#include "common/metrics.h"

namespace pulse::plugin {
namespace fs = std::filesystem;

namespace {

constexpr size_t kInfoMinSize = sizeof(pulse_plugin_info_t);  // the v1.0 layout

int kind_slot(uint32_t kind) {
    switch (kind) {
        case PULSE_KIND_TRANSLATION: return 0;
        case PULSE_KIND_BACKEND: return 1;
        case PULSE_KIND_CONTROLLER: return 2;
        default: return 3;  // PULSE_KIND_POLICY
    }
}
const char* kind_word(uint32_t kind) {
    switch (kind) {
        case PULSE_KIND_TRANSLATION: return "translation";
        case PULSE_KIND_BACKEND: return "backend";
        case PULSE_KIND_CONTROLLER: return "controller";
        case PULSE_KIND_POLICY: return "policy";
        default: return "unknown";
    }
}

// Escapes anything that is not printable ASCII, so a hostile or corrupt string cannot garble
// a log line.
std::string printable(const char* s, size_t max = 200) {
    if (!s) return "(null)";
    std::string out;
    for (size_t i = 0; s[i] && i < max; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        }
    }
    return out;
}

std::string user_name(uid_t uid) {
    if (const passwd* pw = getpwuid(uid)) return pw->pw_name;
    return "uid " + std::to_string(uid);
}

std::string octal(mode_t m) {
    char b[8];
    std::snprintf(b, sizeof b, "%04o", static_cast<unsigned>(m & 07777));
    return b;
}

bool valid_id(const char* id) {
    if (!id || !*id) return false;
    size_t n = 0;
    for (const char* p = id; *p; ++p, ++n) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        if (!ok || n >= 128) return false;
    }
    return true;
}

std::string sha256_file(const fs::path& path) {
    Poco::SHA2Engine sha(Poco::SHA2Engine::SHA_256);
    std::ifstream in(path, std::ios::binary);
    char buf[65536];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) sha.update(buf, static_cast<unsigned>(in.gcount()));
    return Poco::DigestEngine::digestToHex(sha.digest());
}

std::string old_version_of(const std::vector<PluginStatus>& statuses, const fs::path& path) {
    for (const auto& s : statuses)
        if (s.path == path) return s.version;
    return "?";
}

}  // namespace

std::string dlopen_failure(const std::string& raw, const fs::path& mapped, const fs::path& path) {
    // Boost.DLL wraps the loader's text as "... (dlerror system message: TEXT): <errno text>";
    // the errno part is stale (dlopen does not set errno), so only TEXT is kept.
    std::string why = raw;
    const std::string marker = "dlerror system message: ";
    if (size_t at = why.find(marker); at != std::string::npos) {
        why = why.substr(at + marker.size());
        if (size_t end = why.rfind("): "); end != std::string::npos) why.resize(end);
        else if (!why.empty() && why.back() == ')') why.pop_back();
    }
    // The loader names the file it mapped: the staged copy, which means nothing to the operator.
    for (size_t at; !mapped.empty() && mapped != path && (at = why.find(mapped.string())) != std::string::npos;)
        why.replace(at, mapped.string().size(), path.string());
    const std::string undefined = "undefined symbol: ";
    if (size_t at = why.find(undefined); at != std::string::npos) {
        std::string sym = why.substr(at + undefined.size());
        if (size_t end = sym.find_first_of(" \t,("); end != std::string::npos) sym.resize(end);
        return "dlopen failed: unresolved symbol '" + sym + "' (" + why +
               ") (fix: link the library that defines it into the plugin, and link with -Wl,-z,defs so the linker "
               "reports an undefined symbol at build time; a plugin never uses host symbols)";
    }
    if (why.find("cannot open shared object file") != std::string::npos) {
        std::string lib = why.substr(0, why.find(':'));
        if (lib == path.string()) return "dlopen failed: " + why;
        return "dlopen failed: a library the plugin needs is missing: " + why +
               " (fix: install " + lib + ", or give the plugin a RUNPATH where it lives)";
    }
    if (why.find("GLIBCXX_") != std::string::npos || why.find("GLIBC_") != std::string::npos)
        return "dlopen failed: " + why + " (fix: the plugin was built with a newer toolchain than this system's; build it on Debian 12 or older)";
    return "dlopen failed: " + why;
}

void finalize(Generation& g) {
    if (!g.initialized) return;
    g.initialized = false;  // first: deinit runs exactly once, even if it throws
    if (!g.info || !g.info->deinit) return;
    try {
        g.info->deinit(g.state);
    } catch (...) {
        log::error("plugins", "plugin " + g.ctx.plugin_id + ": exception escaped deinit (plugin bug)");
    }
}

const char* state_name(State s) {
    switch (s) {
        case State::loaded: return "loaded";
        case State::skipped: return "skipped";
        case State::rejected: return "rejected";
        case State::failed: return "failed";
    }
    return "?";
}

std::string kinds_text(uint32_t kinds) {
    std::string out;
    for (uint32_t k : {PULSE_KIND_TRANSLATION, PULSE_KIND_BACKEND, PULSE_KIND_CONTROLLER, PULSE_KIND_POLICY})
        if (kinds & k) out += (out.empty() ? "" : "+") + std::string(kind_word(k));
    return out.empty() ? "-" : out;
}

std::string PluginStatus::describe() const {
    std::string s = "plugin " + path.string();
    if (!id.empty()) s += " (" + id + (version.empty() ? "" : " " + version) + ")";
    s += ": ";
    s += state_name(state);
    if (!reason.empty()) s += ": " + reason;
    return s;
}

Generation::Generation() = default;
Generation::~Generation() = default;

// ---------------------------------------------------------------------------------------------
// Pre-flight
// ---------------------------------------------------------------------------------------------

// Names of the defined, default-visibility global symbols in .dynsym: what dlsym() can find.
// Every offset is bounds-checked; a corrupt file gives an error, never a crash.
static std::string exported_symbols(const fs::path& path, std::vector<std::string>& out) {
    // In one piece (rdbuf), not through istreambuf_iterator: that reads a byte per call, and an
    // unoptimised sanitizer build took seconds over a 33 MB plugin, past the tests' start-up wait.
    std::ifstream in(path, std::ios::binary);
    std::ostringstream whole;
    whole << in.rdbuf();
    const std::string data = std::move(whole).str();
    auto fits = [&](uint64_t off, uint64_t len) { return off <= data.size() && len <= data.size() - off; };
    if (!fits(0, sizeof(Elf64_Ehdr))) return "truncated ELF header";
    Elf64_Ehdr eh;
    std::memcpy(&eh, data.data(), sizeof eh);
    if (eh.e_shentsize != sizeof(Elf64_Shdr) || !fits(eh.e_shoff, uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr)))
        return "corrupt ELF section headers";
    auto section = [&](size_t i) {
        Elf64_Shdr sh;
        std::memcpy(&sh, data.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof sh);
        return sh;
    };
    for (size_t i = 0; i < eh.e_shnum; ++i) {
        Elf64_Shdr sym = section(i);
        if (sym.sh_type != SHT_DYNSYM) continue;
        if (sym.sh_link >= eh.e_shnum || sym.sh_entsize != sizeof(Elf64_Sym) || !fits(sym.sh_offset, sym.sh_size))
            return "corrupt ELF dynamic symbol table";
        Elf64_Shdr str = section(sym.sh_link);
        if (!fits(str.sh_offset, str.sh_size)) return "corrupt ELF dynamic string table";
        for (uint64_t off = 0; off + sizeof(Elf64_Sym) <= sym.sh_size; off += sizeof(Elf64_Sym)) {
            Elf64_Sym s;
            std::memcpy(&s, data.data() + sym.sh_offset + off, sizeof s);
            int bind = ELF64_ST_BIND(s.st_info);
            if (s.st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) ||
                ELF64_ST_VISIBILITY(s.st_other) != STV_DEFAULT || s.st_name >= str.sh_size)
                continue;
            const char* name = data.data() + str.sh_offset + s.st_name;
            out.emplace_back(name, strnlen(name, str.sh_size - s.st_name));
        }
    }
    return {};
}

std::string check_directory_path(const fs::path& dir, uid_t service_uid) {
    if (service_uid == static_cast<uid_t>(-1)) service_uid = geteuid();
    std::error_code ec;
    fs::path real = fs::canonical(dir, ec);
    if (ec) return "cannot resolve " + dir.string() + ": " + ec.message();
    // As sshd's StrictModes: whoever can write any directory on the way can swap what lies
    // below it. A sticky directory (/tmp) lets nobody but an entry's owner replace it, and the
    // entry below is checked in turn.
    fs::path at;
    for (const auto& part : real) {
        at /= part;
        struct stat st {};
        if (::stat(at.c_str(), &st) != 0) return "cannot stat " + at.string() + ": " + std::strerror(errno);
        if (st.st_uid != 0 && st.st_uid != service_uid)
            return "directory " + at.string() + " on its path: owner: expected root or the service user (" + user_name(service_uid) + "), found " +
                   user_name(st.st_uid) + " (fix: chown root " + at.string() + ")";
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
            return "directory " + at.string() + " on its path: mode: expected not writable by group or others, found " + octal(st.st_mode) +
                   ": whoever can write it can replace what lies below (fix: chmod go-w " + at.string() + ")";
    }
    return {};
}

std::string check_file(const fs::path& path, uid_t service_uid) {
    std::error_code ec;
    // Every hop of a symlink chain counts: whoever can write the directory a link lies in can
    // retarget it, and whoever can write the target's directories can replace the code.
    fs::path hop = path;
    for (int hops = 0; fs::is_symlink(hop, ec); ++hops) {
        fs::path to = fs::read_symlink(hop, ec);
        if (ec || hops == 40) return "symlink to " + to.string() + " which cannot be resolved (fix: repair or remove the link)";
        if (to.is_relative()) to = hop.parent_path() / to;
        if (hops > 0)
            if (std::string p = check_directory_path(hop.parent_path(), service_uid); !p.empty())
                return "symlink through " + hop.string() + ", whose directory is unsafe: " + p;
        hop = to;
    }
    if (hop != path) {
        fs::path target = fs::canonical(path, ec);
        if (ec) return "symlink to " + fs::read_symlink(path, ec).string() + " which cannot be resolved (fix: repair or remove the link)";
        if (std::string p = check_permissions(target.parent_path(), service_uid); !p.empty())
            return "symlink to " + target.string() + ", whose directory is unsafe: " + p;
        if (std::string p = check_directory_path(target.parent_path(), service_uid); !p.empty())
            return "symlink to " + target.string() + ", whose directory is unsafe: " + p;
    }
    return check_permissions(path, service_uid);
}

std::string check_permissions(const fs::path& path, uid_t service_uid) {
    if (service_uid == static_cast<uid_t>(-1)) service_uid = geteuid();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::string("cannot stat: ") + std::strerror(errno);
    std::string what = S_ISDIR(st.st_mode) ? "directory" : "file";
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return "expected a regular file, found another kind of file (fix: install the plugin as a plain file)";
    if (st.st_uid != 0 && st.st_uid != service_uid)
        return what + " owner: expected root or the service user (" + user_name(service_uid) + "), found " +
               user_name(st.st_uid) + " (fix: chown root " + path.string() + ")";
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return what + " mode: expected not writable by group or others, found " + octal(st.st_mode) +
               " (fix: chmod go-w " + path.string() + ")";
    return {};
}

std::string preflight(const fs::path& path) {
    // 1. Our own ELF header check: precise messages for "not a plugin" and "wrong machine".
    std::ifstream in(path, std::ios::binary);
    unsigned char hdr[sizeof(Elf64_Ehdr)] = {};
    in.read(reinterpret_cast<char*>(hdr), sizeof hdr);
    if (in.gcount() < static_cast<std::streamsize>(EI_NIDENT) || std::memcmp(hdr, ELFMAG, SELFMAG) != 0)
        return "not an ELF shared object: expected the ELF magic \\x7fELF, found something else "
               "(fix: remove the file from the plugin directory)";
    if (hdr[EI_CLASS] != (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32))
        return std::string("wrong ELF class: expected ") + (sizeof(void*) == 8 ? "64" : "32") +
               "-bit, found " + (hdr[EI_CLASS] == ELFCLASS64 ? "64" : "32") +
               "-bit (fix: install the build for this architecture)";
    if (in.gcount() < static_cast<std::streamsize>(sizeof(Elf64_Ehdr))) return "truncated ELF header";
    Elf64_Ehdr eh;
    std::memcpy(&eh, hdr, sizeof eh);
#if defined(__x86_64__)
    constexpr uint16_t kMachine = EM_X86_64;
    constexpr const char* kMachineName = "x86-64";
#elif defined(__aarch64__)
    constexpr uint16_t kMachine = EM_AARCH64;
    constexpr const char* kMachineName = "aarch64";
#else
    constexpr uint16_t kMachine = 0;
    constexpr const char* kMachineName = "this machine";
#endif
    if (kMachine && eh.e_machine != kMachine)
        return std::string("wrong architecture: expected ") + kMachineName + ", found ELF machine " +
               std::to_string(eh.e_machine) + " (fix: install the build for this architecture)";
    if (eh.e_type != ET_DYN)
        return "not a shared object: expected ELF type ET_DYN, found " + std::to_string(eh.e_type) +
               " (fix: build the plugin with shared_module()/-shared)";

    // 2. Boost.DLL validates the container as a whole (it throws for a file it cannot parse).
    //    Its symbols() is not used: in Boost 1.74 it pairs .symtab with the wrong string table
    //    (see docs/SDK.md), and a stripped plugin has no .symtab at all. The dynamic symbol
    //    table is what dlsym() searches, so that is what we read.
    try {
        boost::dll::library_info info(path);
        (void)info.sections();
    } catch (const std::exception& e) {
        return std::string("cannot read the ELF file: ") + e.what();
    }
    std::vector<std::string> symbols;
    if (std::string err = exported_symbols(path, symbols); !err.empty()) return err;
    if (std::find(symbols.begin(), symbols.end(), PULSE_PLUGIN_ENTRY_SYMBOL) != symbols.end()) return {};
    static const std::regex other(R"(pulse_plugin_entry_v([0-9]+))");
    for (const auto& sym : symbols) {
        std::smatch m;
        if (std::regex_match(sym, m, other))
            return "built for Pulse plugin ABI v" + m[1].str() + ", this host speaks v" +
                   std::to_string(PULSE_ABI_MAJOR) + " (fix: install the v" + std::to_string(PULSE_ABI_MAJOR) +
                   " build of the plugin, or a Pulse that speaks v" + m[1].str() + ")";
    }
    return std::string("no entry point: expected an exported symbol ") + PULSE_PLUGIN_ENTRY_SYMBOL +
           ", found none (fix: define it with PULSE_EXPORT, or remove the file if it is not a Pulse plugin)";
}

// ---------------------------------------------------------------------------------------------
// PluginManager
// ---------------------------------------------------------------------------------------------

PluginManager::PluginManager(Options options) : options_(std::move(options)) {}

PluginManager::~PluginManager() { shutdown(); }

bool PluginManager::is_required(const std::string& id) const {
    return std::find(options_.require.begin(), options_.require.end(), id) != options_.require.end();
}

void PluginManager::record(PluginStatus status) {
    status.required = status.required || is_required(status.id);
    std::string line = status.describe();
    switch (status.state) {
        case State::loaded: log::info("plugins", line); break;
        case State::skipped: log::info("plugins", line); break;
        default:
            if (status.required) log::error("plugins", line + " [required]");
            else log::warn("plugins", line + " (optional plugin: skipped)");
    }
    std::lock_guard lock(status_mutex_);
    statuses_.push_back(std::move(status));
}

std::vector<PluginStatus> PluginManager::status_snapshot() const {
    std::lock_guard lock(status_mutex_);
    return statuses_;
}

namespace {

// A shared object by its content: the ELF magic and e_type ET_DYN in the byte order the header
// names. A renamed plugin ("x.so.disabled", "x.so.1") keeps both.
bool is_shared_object(const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    unsigned char h[EI_NIDENT + 2] = {};
    if (!in.read(reinterpret_cast<char*>(h), sizeof h) || std::memcmp(h, ELFMAG, SELFMAG) != 0) return false;
    const unsigned type = h[EI_DATA] == ELFDATA2MSB ? (h[EI_NIDENT] << 8 | h[EI_NIDENT + 1]) : (h[EI_NIDENT + 1] << 8 | h[EI_NIDENT]);
    return type == ET_DYN;
}

}  // namespace

// Whether an entry of a plugin directory that is not loaded is worth a "skipped" row: a file
// that is a shared object or is named like one, or a directory that holds a *.so file.
bool PluginManager::might_be_plugin(const fs::path& p) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
        for (const auto& e : fs::directory_iterator(p, ec))
            if (e.path().extension() == ".so" && !e.is_directory(ec)) return true;
        return false;
    }
    return p.filename().string().find(".so") != std::string::npos || is_shared_object(p);
}

void PluginManager::scan_dir(const fs::path& dir, bool configured) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
        if (configured) log::warn("plugins", "plugin directory " + dir.string() + " does not exist");
        else log::debug("plugins", "drop-in directory " + dir.string() + " does not exist");
        return;
    }
    std::string p = check_permissions(dir, options_.service_uid);
    if (p.empty()) p = check_directory_path(dir, options_.service_uid);
    if (!p.empty()) {
        PluginStatus s;
        s.path = dir;
        s.state = State::rejected;
        s.reason = "whole directory ignored: " + p;
        record(std::move(s));
        return;
    }
    std::vector<fs::path> files, others;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() == ".so" && !e.is_directory(ec)) files.push_back(e.path());
        else if (might_be_plugin(e.path())) others.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    std::sort(others.begin(), others.end());
    // What could be a plugin but is not loaded is said, not passed over: a plugin in a
    // sub-directory or without the .so suffix (a renamed or half-copied file) is a common
    // mistake. What cannot be one (a README, an archive, a build's object folder) is no news.
    for (const auto& f : others) {
        PluginStatus s;
        s.path = fs::absolute(f);
        s.state = State::skipped;
        s.reason = fs::is_directory(f, ec) ? "a directory (plugin directories are not searched recursively)"
                                           : "not a plugin file name (only *.so files are loaded)";
        record(std::move(s));
    }
    for (const auto& f : files) load_file(fs::absolute(f));
}

void PluginManager::load_all() {
    for (const auto& d : options_.dirs) scan_dir(d, true);
    for (const auto& d : options_.dropin_dirs) scan_dir(d, false);
}

std::string PluginManager::stage(const fs::path& path, const std::string& sha, fs::path& out) {
    std::error_code ec;
    const fs::path& dir = options_.runtime_dir;
    if (dir.empty()) return "no runtime directory configured";
    fs::create_directories(dir, ec);
    if (ec) return "cannot create " + dir.string() + ": " + ec.message();
    fs::permissions(dir, fs::perms::owner_all, ec);
    out = dir / (path.stem().string() + "-" + sha + ".so");
    if (!fs::exists(out)) {
        fs::path tmp = out;
        tmp += "." + std::to_string(::getpid()) + ".tmp";  // several Pulse processes may share the directory
        fs::remove(tmp, ec);
        if (!fs::copy_file(path, tmp, ec)) return "cannot copy to " + tmp.string() + ": " + ec.message();
        fs::permissions(tmp, fs::perms::owner_read | fs::perms::owner_exec, ec);
        fs::rename(tmp, out, ec);
        if (ec) return "cannot rename " + tmp.string() + ": " + ec.message();
    }
    // The copy must be what we hashed (a concurrent writer could have changed the source).
    if (sha256_file(out) != sha) {
        fs::remove(out, ec);
        return "the staged copy " + out.string() + " does not match the plugin file (was it being written?)";
    }
    return {};
}

// Step 4 of a load: the info struct's fields, copied into `st` and checked. Every problem
// found, joined, or "" when there is none.
std::string PluginManager::check_info(const pulse_plugin_info_t& i, const fs::path& path, PluginStatus& st, bool reloading) const {
    const pulse_plugin_info_t* info = &i;
    std::vector<std::string> problems;
    st.id = printable(info->id);
    st.version = printable(info->version);
    st.build_info = printable(info->build_info, 400);
    st.kinds = info->kinds;
    st.abi_major = info->abi_major;
    st.abi_minor_built = info->abi_minor_built;
    st.abi_minor_required = info->abi_minor_required;
    st.required = is_required(st.id);
    if (info->abi_major != PULSE_ABI_MAJOR)
        problems.push_back("built for Pulse plugin ABI v" + std::to_string(info->abi_major) + ", this host speaks v" +
                           std::to_string(PULSE_ABI_MAJOR) + " (fix: install the v" + std::to_string(PULSE_ABI_MAJOR) +
                           " build of the plugin)");
    else if (info->abi_minor_required > PULSE_ABI_MINOR)
        problems.push_back("requires host plugin ABI >= " + std::to_string(PULSE_ABI_MAJOR) + "." +
                           std::to_string(info->abi_minor_required) + ", this host is " + std::to_string(PULSE_ABI_MAJOR) +
                           "." + std::to_string(PULSE_ABI_MINOR) + " (fix: upgrade Pulse, or rebuild the plugin with PULSE_TARGET_ABI_MINOR=" +
                           std::to_string(PULSE_ABI_MINOR) + ")");
    if (info->abi_minor_required > info->abi_minor_built)
        problems.push_back("abi_minor_required " + std::to_string(info->abi_minor_required) + " is newer than abi_minor_built " +
                           std::to_string(info->abi_minor_built) + " (header mismatch)");
    if (info->reserved != 0) problems.push_back("reserved field: expected 0, found " + std::to_string(info->reserved) + " (header mismatch)");
    if (!valid_id(info->id)) problems.push_back("id: expected 1-128 characters of [a-z0-9._-], found '" + st.id + "'");
    if (!info->version || !*info->version) problems.push_back("version: expected a version string, found none");
    if (!info->init) problems.push_back("init: expected a function, found NULL");
    if ((info->kinds & ~(PULSE_KIND_TRANSLATION | PULSE_KIND_BACKEND | PULSE_KIND_CONTROLLER | PULSE_KIND_POLICY)) != 0)
        log::warn("plugins", "plugin " + path.string() + " declares unknown component kinds; they will be ignored");
    if (problems.empty() && !reloading) {
        if (auto it = ids_.find(st.id); it != ids_.end())
            problems.push_back("duplicate plugin id '" + st.id + "': also in " + it->second.string() +
                               "; neither file is loaded (fix: remove one of the two)");
    }
    std::string joined;
    for (const auto& p : problems) joined += (joined.empty() ? "" : "; ") + p;
    return joined;
}

// Step 6 of a load: the plugin's init, which registers its components. Returns how the load
// failed and why, or an empty reason when the plugin is ready.
std::pair<State, std::string> PluginManager::run_init(Generation& gen, const std::string& id) {
    pulse_call call;
    pulse_status_t rc;
    gen.ctx.in_init = true;
    try {
        rc = gen.info->init(host::api(), &gen.ctx, &call, &gen.state);
    } catch (const std::exception& e) {
        rc = PULSE_E_INTERNAL;
        call.message = std::string("exception escaped init (plugin bug): ") + e.what();
        call.has_message = true;
    } catch (...) {
        rc = PULSE_E_INTERNAL;
        call.message = "exception escaped init (plugin bug)";
        call.has_message = true;
    }
    gen.ctx.in_init = false;
    std::string refused;  // what the host refused at registration, if anything
    for (const auto& p : gen.ctx.problems) refused += (refused.empty() ? "" : "; ") + p;
    // An init that passes on a refused register_* call's status has no message of its own: the
    // refusal is the reason, and the author needs it, not "without an error message".
    if (rc != PULSE_OK && !call.has_message && !refused.empty())
        return {State::failed, "init failed: the host refused its registration: " + refused};
    if (rc != PULSE_OK) return {State::failed, std::string("init failed: ") + host::call_error(call, rc, id)};
    gen.initialized = true;
    if (!gen.ctx.problems.empty()) {
        const std::string& joined = refused;
        finalize(gen);
        return {State::failed, "registration failed: " + joined};
    }
    return {State::loaded, {}};
}

std::shared_ptr<Generation> PluginManager::load_generation(const fs::path& path, PluginStatus& st, bool reloading) {
    st.path = path;
    auto reject = [&](State state, std::string reason) -> std::shared_ptr<Generation> {
        st.state = state;
        st.reason = std::move(reason);
        return nullptr;
    };

    // Step 0-1: ownership and mode, then the file itself; no plugin code runs yet.
    if (std::string p = check_file(path, options_.service_uid); !p.empty()) return reject(State::rejected, p);
    if (std::string p = preflight(path); !p.empty()) return reject(State::rejected, p);

    // Stage a content-addressed copy: the mapped file is never the one an operator replaces.
    auto gen = std::make_shared<Generation>();
    gen->path = path;
    gen->sha256 = sha256_file(path);
    gen->mapped = path;
    if (std::string why = stage(path, gen->sha256, gen->mapped); !why.empty()) {
        if (reloading) return reject(State::failed, "cannot stage the new version: " + why);
        gen->mapped = path;
        log::debug("plugins", "loading " + path.string() + " in place (" + why + "); hot reload of it is disabled");
    }

    // Step 2: dlopen with RTLD_NOW so missing dependencies surface now, with the loader's text.
    try {
        namespace mode = boost::dll::load_mode;
        gen->library = std::make_unique<boost::dll::shared_library>(gen->mapped, mode::rtld_now | mode::rtld_local);
    } catch (const std::exception& e) {
        return reject(State::rejected, dlopen_failure(e.what(), gen->mapped, path));
    }
    if (!gen->library->has(PULSE_PLUGIN_ENTRY_SYMBOL))
        return reject(State::rejected, std::string("no entry point: expected an exported symbol ") + PULSE_PLUGIN_ENTRY_SYMBOL + ", found none");

    // Step 3: the entry returns a static, side-effect-free info struct.
    auto entry = gen->library->get<const pulse_plugin_info_t*()>(PULSE_PLUGIN_ENTRY_SYMBOL);
    const pulse_plugin_info_t* info = entry();
    if (!info) return reject(State::rejected, "the entry returned NULL: expected a pointer to a static pulse_plugin_info_t");

    // Step 4: validate; copy strings out first, then collect every problem.
    if (info->struct_size < kInfoMinSize)
        return reject(State::rejected, "info struct_size: expected >= " + std::to_string(kInfoMinSize) + ", found " +
                                           std::to_string(info->struct_size) + " (corrupt or foreign file; rebuild against the Pulse SDK)");
    if (std::string p = check_info(*info, path, st, reloading); !p.empty()) return reject(State::rejected, p);
    gen->info = info;
    gen->ctx.plugin_id = st.id;
    gen->ctx.generation = next_generation_++;
    gen->ctx.declared_kinds = info->kinds;

    // Step 5: probe ("can I run here?").
    if (info->probe) {
        pulse_str_t why{nullptr, 0};
        bool ok = false;
        try {
            ok = info->probe(host::api(), &why);
        } catch (...) {
            why = {"probe threw an exception (plugin bug)", 37};
        }
        if (!ok)
            return reject(st.required ? State::failed : State::skipped,
                          "not available on this system: " +
                              (why.ptr ? std::string(why.ptr, why.len) : std::string("probe returned false without a reason")));
    }

    // Step 6: init; the plugin registers its components through the host table.
    if (auto [state, why] = run_init(*gen, st.id); !why.empty()) return reject(state, why);
    return gen;
}

const PluginStatus& PluginManager::load_file(const fs::path& path) {
    PluginStatus st;
    auto gen = load_generation(path, st, /*reloading=*/false);
    if (!gen) {
        // Two files with one id: which one is meant is not for the loader to guess (the first
        // by name was an older version as often as not). Neither serves; both say why.
        if (auto it = ids_.find(st.id); it != ids_.end() && st.reason.find("duplicate plugin id") != std::string::npos)
            retract(st.id, it->second, path);
        record(std::move(st));
        return statuses_.back();
    }
    if (std::string clash = conflict(*gen); !clash.empty()) {
        finalize(*gen);
        st.state = State::failed;
        st.reason = clash;
        record(std::move(st));
        return statuses_.back();
    }
    publish(gen, st);
    if (gen->ctx.registrations.empty()) log::warn("plugins", "plugin " + path.string() + " (" + st.id + ") registered no components");
    ids_[st.id] = path;
    generations_.push_back(gen);
    st.state = State::loaded;
    record(std::move(st));
    return statuses_.back();
}

// Keeps a finished generation's library mapped for the life of the process: no destructor ever
// dlcloses plugin code (docs/SDK.md, "Unloading").
static void pin(std::shared_ptr<Generation> g) {
    static auto* pinned = new std::vector<std::shared_ptr<Generation>>();
    pinned->push_back(std::move(g));
}

void PluginManager::retract(const std::string& id, const fs::path& loaded, const fs::path& other) {
    auto it = std::find_if(generations_.begin(), generations_.end(),
                           [&](const auto& g) { return g->ctx.plugin_id == id && g->path == loaded; });
    if (it == generations_.end()) return;  // retracted already (a third copy)
    std::shared_ptr<Generation> gen = *it;
    {
        std::lock_guard lock(mutex_);
        for (auto& map : components_)
            for (auto c = map.begin(); c != map.end();) c = c->second->generation == gen ? map.erase(c) : std::next(c);
    }
    generations_.erase(it);
    finalize(*gen);  // loading is not over: nothing holds its components yet
    pin(std::move(gen));
    std::lock_guard lock(status_mutex_);
    for (auto& s : statuses_)
        if (s.state == State::loaded && s.id == id && s.path == loaded) {
            s.state = State::rejected;
            s.components.clear();
            s.reason = "duplicate plugin id '" + id + "': also in " + other.string() + "; neither file is loaded (fix: remove one of the two)";
            if (s.required) log::error("plugins", s.describe() + " [required]");
            else log::warn("plugins", s.describe());
        }
}

std::string PluginManager::conflict(const Generation& gen) const {
    std::lock_guard lock(mutex_);
    for (const auto& r : gen.ctx.registrations) {
        const auto& map = components_[kind_slot(r.kind)];
        if (auto it = map.find(r.name); it != map.end())
            return std::string(kind_word(r.kind)) + " '" + r.name + "' is already provided by plugin " + it->second->plugin_id() + " (" +
                   it->second->generation->path.string() + "); fix: remove one of the two plugins";
    }
    return {};
}

void PluginManager::publish(const std::shared_ptr<Generation>& gen, PluginStatus& st, const std::shared_ptr<Generation>& replaced) {
    std::lock_guard lock(mutex_);
    if (replaced)
        for (auto& map : components_)
            for (auto it = map.begin(); it != map.end();) it = it->second->generation == replaced ? map.erase(it) : std::next(it);
    for (const auto& r : gen->ctx.registrations) {
        auto c = std::make_shared<Component>();
        c->generation = gen;
        c->registration = r;
        components_[kind_slot(r.kind)][r.name] = c;
        st.components.push_back(std::string(kind_word(r.kind)) + " " + r.name);
    }
}

// The failure of one file of a reload: reported, logged, counted.
void PluginManager::reload_failed(ReloadReport& rep, const std::string& msg) {
    ++rep.failed;
    rep.messages.push_back(msg);
    log::error("reload", msg);
    metrics::global().counter(metrics::kPluginReloadFailures.name, metrics::kPluginReloadFailures.help).add();
}

// A refused new version of a loaded file: the refusal shows next to the version that serves.
void PluginManager::reload_refused(ReloadReport& rep, const fs::path& f, const std::string& msg) {
    reload_failed(rep, msg);
    std::lock_guard lock(status_mutex_);
    for (auto& s : statuses_)
        if (s.path == f) s.reload_refused = msg;
}

// The plugin files present now, in the configured order (a directory that fails its checks is
// skipped whole, and reported).
std::vector<fs::path> PluginManager::reload_files(ReloadReport& rep) {
    std::vector<fs::path> files;
    for (const auto* dirs : {&options_.dirs, &options_.dropin_dirs})
        for (const auto& d : *dirs) {
            std::error_code ec;
            if (!fs::is_directory(d, ec)) continue;
            std::string p = check_permissions(d, options_.service_uid);
            if (p.empty()) p = check_directory_path(d, options_.service_uid);
            if (!p.empty()) {
                reload_failed(rep, "plugin directory " + d.string() + ": whole directory ignored by the reload: " + p);
                continue;
            }
            std::vector<fs::path> here;
            for (const auto& e : fs::directory_iterator(d, ec))
                if (e.path().extension() == ".so") here.push_back(fs::absolute(e.path()));
            std::sort(here.begin(), here.end());
            files.insert(files.end(), here.begin(), here.end());
        }
    return files;
}

// A file not loaded before (new, or rejected earlier): only translation profiles may join at
// run time.
void PluginManager::reload_new(const fs::path& f, ReloadReport& rep) {
    bool known = std::any_of(statuses_.begin(), statuses_.end(), [&](const PluginStatus& s) { return s.path == f; });
    std::string sha = sha256_file(f);
    bool seen_same = std::any_of(retired_.begin(), retired_.end(), [&](const auto& g) { return g->path == f && g->sha256 == sha; });
    if (seen_same) return;
    PluginStatus st;
    auto gen = load_generation(f, st, /*reloading=*/true);
    if (!gen) {
        if (!known) reload_failed(rep, "plugin " + f.string() + ": " + state_name(st.state) + ": " + st.reason);
        return;
    }
    if (gen->info->kinds != PULSE_KIND_TRANSLATION) {
        finalize(*gen);
        retired_.push_back(gen);  // keep the mapping; it never served
        reload_failed(rep, "plugin " + f.string() + " (" + st.id + "): a new backend or controller requires restart");
        return;
    }
    std::string refused = ids_.count(st.id) ? "duplicate plugin id '" + st.id + "': already loaded from " + ids_[st.id].string()
                                            : conflict(*gen);
    if (!refused.empty()) {
        finalize(*gen);
        retired_.push_back(gen);
        reload_failed(rep, "plugin " + f.string() + ": " + refused);
        return;
    }
    publish(gen, st);
    ids_[st.id] = f;
    generations_.push_back(gen);
    st.state = State::loaded;
    {
        std::lock_guard lock(status_mutex_);
        statuses_.push_back(st);
    }
    ++rep.added;
    rep.messages.push_back("added " + st.id + " " + st.version + " from " + f.string());
    log::info("reload", rep.messages.back());
}

// A file loaded before: a translation profile whose content changed gets a new generation.
void PluginManager::reload_changed(std::shared_ptr<Generation>& cur, const fs::path& f, ReloadReport& rep) {
    std::shared_ptr<Generation> old = cur;
    std::string sha = sha256_file(f);
    if (sha == old->sha256) {
        ++rep.unchanged;
        return;
    }
    const std::string& id = old->ctx.plugin_id;
    if (old->info->kinds != PULSE_KIND_TRANSLATION) {
        reload_refused(rep, f, "plugin " + f.string() + " (" + id + ") changed, but backends, controllers and policies are not reloaded: restart Pulse to use it");
        return;
    }
    if (old->mapped == old->path) {
        reload_refused(rep, f, "plugin " + f.string() + " (" + id + ") changed, but it was loaded in place (no usable runtime_dir): restart Pulse to use it");
        return;
    }
    if (retired_per_id_[id] >= options_.max_retired_per_plugin) {
        reload_refused(rep, f, "plugin " + id + ": " + std::to_string(options_.max_retired_per_plugin) +
                                   " retired versions are still mapped; restart required to reclaim retired plugin code");
        return;
    }
    PluginStatus st;
    auto gen = load_generation(f, st, /*reloading=*/true);
    if (!gen) {
        reload_refused(rep, f, "plugin " + f.string() + " (" + id + "): new version not loaded, the old one keeps serving: " + st.reason);
        return;
    }
    if (st.id != id || gen->info->kinds != PULSE_KIND_TRANSLATION) {
        finalize(*gen);
        retired_.push_back(gen);
        reload_refused(rep, f, "plugin " + f.string() + ": the new file is '" + st.id + "' (" + kinds_text(gen->info->kinds) + "), expected '" +
                                   id + "' (translation); the old version keeps serving");
        return;
    }
    // New leases get the new generation; streams in flight keep theirs.
    publish(gen, st, old);
    std::string old_version = old_version_of(statuses_, f);
    cur = gen;
    retired_.push_back(old);
    ++retired_per_id_[id];
    {
        std::lock_guard lock(status_mutex_);
        for (auto& s : statuses_)
            if (s.path == f) {
                s.version = st.version;
                s.build_info = st.build_info;
                s.reload_refused.clear();
            }
    }
    ++rep.reloaded;
    rep.messages.push_back("reloaded " + id + " " + old_version + " -> generation " + std::to_string(gen->ctx.generation) +
                           " (" + st.version + ", sha256 " + gen->sha256.substr(0, 12) + ")");
    log::info("reload", rep.messages.back());
}

ReloadReport PluginManager::reload() {
    ReloadReport rep;
    for (const auto& f : reload_files(rep)) {
        auto cur = std::find_if(generations_.begin(), generations_.end(), [&](const auto& g) { return g->path == f; });
        if (cur == generations_.end()) reload_new(f, rep);
        else reload_changed(*cur, f, rep);
    }
    return rep;
}

void PluginManager::collect_retired() {
    for (auto it = retired_.begin(); it != retired_.end();) {
        // Only this list holds it: no lease, no component. Finalise on this (control) thread.
        if (it->use_count() == 1) {
            auto& g = *it;
            if (g->initialized) log::info("reload", "plugin " + g->ctx.plugin_id + " generation " + std::to_string(g->ctx.generation) + " retired");
            finalize(*g);
            pin(g);
            it = retired_.erase(it);
        } else {
            ++it;
        }
    }
}

std::vector<std::string> PluginManager::fatal_problems() const {
    std::vector<std::string> out;
    for (const auto& s : statuses_)
        if (s.required && s.state != State::loaded) out.push_back(s.describe());
    for (const auto& id : options_.require) {
        bool seen = std::any_of(statuses_.begin(), statuses_.end(), [&](const PluginStatus& s) { return s.id == id; });
        if (!seen) {
            std::string msg = "required plugin '" + id + "' was not found in the plugin directories";
            std::string dirs;
            for (const auto& d : options_.dirs) dirs += (dirs.empty() ? "" : ", ") + d.string();
            for (const auto& d : options_.dropin_dirs) dirs += (dirs.empty() ? "" : ", ") + d.string();
            msg += " (searched: " + (dirs.empty() ? std::string("none") : dirs) + ")";
            out.push_back(msg);
        }
    }
    return out;
}

ComponentLease PluginManager::translation(const std::string& name) const {
    std::lock_guard lock(mutex_);
    auto it = components_[0].find(name);
    return it == components_[0].end() ? nullptr : it->second;
}
ComponentLease PluginManager::backend(const std::string& name) const {
    std::lock_guard lock(mutex_);
    auto it = components_[1].find(name);
    return it == components_[1].end() ? nullptr : it->second;
}
ComponentLease PluginManager::controller(const std::string& name) const {
    std::lock_guard lock(mutex_);
    auto it = components_[2].find(name);
    return it == components_[2].end() ? nullptr : it->second;
}
ComponentLease PluginManager::policy(const std::string& name) const {
    std::lock_guard lock(mutex_);
    auto it = components_[3].find(name);
    return it == components_[3].end() ? nullptr : it->second;
}
std::vector<std::string> PluginManager::component_names(uint32_t kind) const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [n, c] : components_[kind_slot(kind)]) out.push_back(n);
    return out;
}

void PluginManager::shutdown() {
    {
        std::lock_guard lock(mutex_);
        for (auto& m : components_) m.clear();
    }
    // Reverse load order. Code stays mapped (pinned): the library handles move to a
    // process-lifetime list so no destructor ever dlcloses them.
    // A generation still leased has instances alive (their owner did not release them first): its
    // deinit would free what their destroy and stream_close still use, so it does not run.
    auto finish = [](const std::shared_ptr<Generation>& g) {
        if (g->initialized && g.use_count() > 2)  // this list's reference and the caller's copy
            log::error("plugins", "plugin " + g->ctx.plugin_id + " is still in use at shutdown (" + std::to_string(g.use_count() - 2) +
                                      " leases): its deinit is not run, so that nothing it frees is used afterwards (host bug)");
        else
            finalize(*g);
        pin(g);
    };
    for (auto it = generations_.rbegin(); it != generations_.rend(); ++it) finish(std::shared_ptr<Generation>(*it));
    generations_.clear();
    for (auto& g : retired_) finish(std::shared_ptr<Generation>(g));
    retired_.clear();
}

}  // namespace pulse::plugin
