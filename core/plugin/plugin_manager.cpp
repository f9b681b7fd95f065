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

#include <boost/dll/library_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "common/log.h"

namespace pulse::plugin {
namespace fs = std::filesystem;

namespace {

constexpr size_t kInfoMinSize = sizeof(pulse_plugin_info_t);  // the v1.0 layout

int kind_slot(uint32_t kind) {
    switch (kind) {
        case PULSE_KIND_TRANSLATION: return 0;
        case PULSE_KIND_BACKEND: return 1;
        default: return 2;
    }
}
const char* kind_word(uint32_t kind) {
    switch (kind) {
        case PULSE_KIND_TRANSLATION: return "translation";
        case PULSE_KIND_BACKEND: return "backend";
        case PULSE_KIND_CONTROLLER: return "controller";
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

}  // namespace

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
    for (uint32_t k : {PULSE_KIND_TRANSLATION, PULSE_KIND_BACKEND, PULSE_KIND_CONTROLLER})
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
    std::ifstream in(path, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), {});
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
    statuses_.push_back(std::move(status));
}

void PluginManager::scan_dir(const fs::path& dir, bool configured) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
        if (configured) log::warn("plugins", "plugin directory " + dir.string() + " does not exist");
        else log::debug("plugins", "drop-in directory " + dir.string() + " does not exist");
        return;
    }
    if (std::string p = check_permissions(dir, options_.service_uid); !p.empty()) {
        PluginStatus s;
        s.path = dir;
        s.state = State::rejected;
        s.reason = "whole directory ignored: " + p;
        record(std::move(s));
        return;
    }
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".so") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) load_file(fs::absolute(f));
}

void PluginManager::load_all() {
    for (const auto& d : options_.dirs) scan_dir(d, true);
    for (const auto& d : options_.dropin_dirs) scan_dir(d, false);
}

const PluginStatus& PluginManager::load_file(const fs::path& path) {
    PluginStatus st;
    st.path = path;
    auto reject = [&](State state, std::string reason) -> const PluginStatus& {
        st.state = state;
        st.reason = std::move(reason);
        record(std::move(st));
        return statuses_.back();
    };

    // Step 0-1: ownership and mode, then the file itself; no plugin code runs yet.
    if (std::string p = check_permissions(path, options_.service_uid); !p.empty()) return reject(State::rejected, p);
    if (std::string p = preflight(path); !p.empty()) return reject(State::rejected, p);

    // Step 2: dlopen with RTLD_NOW so missing dependencies surface now, with the loader's text.
    auto gen = std::make_shared<Generation>();
    gen->path = path;
    try {
        namespace mode = boost::dll::load_mode;
        gen->library = std::make_unique<boost::dll::shared_library>(path, mode::rtld_now | mode::rtld_local);
    } catch (const std::exception& e) {
        std::string why = e.what();
        std::string hint;
        if (why.find("GLIBCXX_") != std::string::npos || why.find("GLIBC_") != std::string::npos)
            hint = " (hint: the plugin was built with a newer toolchain than this system's; build it on Debian 12 or older)";
        return reject(State::rejected, "dlopen failed: " + why + hint);
    }
    if (!gen->library->has(PULSE_PLUGIN_ENTRY_SYMBOL))
        return reject(State::rejected, std::string("no entry point: expected an exported symbol ") +
                                           PULSE_PLUGIN_ENTRY_SYMBOL + ", found none");

    // Step 3: the entry returns a static, side-effect-free info struct.
    auto entry = gen->library->get<const pulse_plugin_info_t*()>(PULSE_PLUGIN_ENTRY_SYMBOL);
    const pulse_plugin_info_t* info = entry();
    if (!info) return reject(State::rejected, "the entry returned NULL: expected a pointer to a static pulse_plugin_info_t");

    // Step 4: validate; copy strings out first, then collect every problem.
    std::vector<std::string> problems;
    if (info->struct_size < kInfoMinSize) {
        return reject(State::rejected, "info struct_size: expected >= " + std::to_string(kInfoMinSize) + ", found " +
                                           std::to_string(info->struct_size) +
                                           " (corrupt or foreign file; rebuild against the Pulse SDK)");
    }
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
                           std::to_string(info->abi_minor_required) + ", this host is " +
                           std::to_string(PULSE_ABI_MAJOR) + "." + std::to_string(PULSE_ABI_MINOR) +
                           " (fix: upgrade Pulse, or rebuild the plugin with PULSE_TARGET_ABI_MINOR=" +
                           std::to_string(PULSE_ABI_MINOR) + ")");
    if (info->abi_minor_required > info->abi_minor_built)
        problems.push_back("abi_minor_required " + std::to_string(info->abi_minor_required) +
                           " is newer than abi_minor_built " + std::to_string(info->abi_minor_built) + " (header mismatch)");
    if (info->reserved != 0)
        problems.push_back("reserved field: expected 0, found " + std::to_string(info->reserved) + " (header mismatch)");
    if (!valid_id(info->id))
        problems.push_back("id: expected 1-128 characters of [a-z0-9._-], found '" + st.id + "'");
    if (!info->version || !*info->version) problems.push_back("version: expected a version string, found none");
    if (!info->init) problems.push_back("init: expected a function, found NULL");
    if ((info->kinds & ~(PULSE_KIND_TRANSLATION | PULSE_KIND_BACKEND | PULSE_KIND_CONTROLLER)) != 0)
        log::warn("plugins", "plugin " + path.string() + " declares unknown component kinds 0x" +
                                 std::to_string(info->kinds) + "; they will be ignored");
    if (problems.empty()) {
        if (auto it = ids_.find(st.id); it != ids_.end())
            problems.push_back("duplicate plugin id '" + st.id + "': already loaded from " + it->second.string() +
                               " (fix: remove one of the two files)");
    }
    if (!problems.empty()) {
        std::string joined;
        for (const auto& p : problems) joined += (joined.empty() ? "" : "; ") + p;
        return reject(State::rejected, joined);
    }
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
        if (!ok) {
            std::string reason = "not available on this system: " +
                                 (why.ptr ? std::string(why.ptr, why.len) : std::string("probe returned false without a reason"));
            return reject(st.required ? State::failed : State::skipped, reason);
        }
    }

    // Step 6: init; the plugin registers its components through the host table.
    pulse_call call;
    pulse_status_t rc;
    gen->ctx.in_init = true;
    try {
        rc = info->init(host::api(), &gen->ctx, &call, &gen->state);
    } catch (const std::exception& e) {
        rc = PULSE_E_INTERNAL;
        call.message = std::string("exception escaped init (plugin bug): ") + e.what();
        call.has_message = true;
    } catch (...) {
        rc = PULSE_E_INTERNAL;
        call.message = "exception escaped init (plugin bug)";
        call.has_message = true;
    }
    gen->ctx.in_init = false;
    if (rc != PULSE_OK)
        return reject(State::failed, std::string("init failed: ") + host::call_error(call, rc, st.id));
    gen->initialized = true;

    auto undo_init = [&] {
        if (info->deinit) info->deinit(gen->state);
        gen->initialized = false;
    };
    if (!gen->ctx.problems.empty()) {
        std::string joined;
        for (const auto& p : gen->ctx.problems) joined += (joined.empty() ? "" : "; ") + p;
        undo_init();
        return reject(State::failed, "registration failed: " + joined);
    }
    {
        std::lock_guard lock(mutex_);
        for (const auto& r : gen->ctx.registrations) {
            auto& map = components_[kind_slot(r.kind)];
            if (auto it = map.find(r.name); it != map.end()) {
                std::string other = it->second->plugin_id();
                undo_init();
                return reject(State::failed, std::string(kind_word(r.kind)) + " '" + r.name +
                                                 "' is already provided by plugin " + other + " (" +
                                                 it->second->generation->path.string() +
                                                 "); fix: remove one of the two plugins");
            }
        }
        for (const auto& r : gen->ctx.registrations) {
            auto c = std::make_shared<Component>();
            c->generation = gen;
            c->registration = r;
            components_[kind_slot(r.kind)][r.name] = c;
            st.components.push_back(std::string(kind_word(r.kind)) + " " + r.name);
        }
    }
    if (gen->ctx.registrations.empty())
        log::warn("plugins", "plugin " + path.string() + " (" + st.id + ") registered no components");
    ids_[st.id] = path;
    generations_.push_back(gen);
    st.state = State::loaded;
    record(std::move(st));
    return statuses_.back();
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
    static auto* pinned = new std::vector<std::shared_ptr<Generation>>();
    for (auto it = generations_.rbegin(); it != generations_.rend(); ++it) {
        auto& g = *it;
        if (g->initialized && g->info && g->info->deinit) {
            try {
                g->info->deinit(g->state);
            } catch (...) {
                log::error("plugins", "plugin " + g->ctx.plugin_id + ": exception escaped deinit (plugin bug)");
            }
        }
        g->initialized = false;
        pinned->push_back(g);
    }
    generations_.clear();
}

}  // namespace pulse::plugin
