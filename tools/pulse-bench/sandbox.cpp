#include "pulse-bench/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace pulse::bench {
namespace fs = std::filesystem;

const char* outcome_name(Outcome o) {
    switch (o) {
        case Outcome::passed: return "passed";
        case Outcome::failed: return "failed";
        case Outcome::timeout: return "timeout";
        case Outcome::crashed: return "crashed";
        case Outcome::error: return "error";
    }
    return "?";
}

namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;
constexpr int kSetupFailed = 125;

// Only async-signal-safe calls below this point run in the forked children: these helpers use
// open/write/close and fixed buffers.
void say(const char* what) {
    char buf[256];
    int n = std::snprintf(buf, sizeof buf, "sandbox: %s: %s\n", what, std::strerror(errno));
    if (n > 0) {
        ssize_t w = ::write(2, buf, static_cast<size_t>(n));
        (void)w;
    }
}
[[noreturn]] void die(const char* what) {
    say(what);
    ::_exit(kSetupFailed);
}
bool write_file(const char* path, const char* text) {
    int fd = ::open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = ::write(fd, text, std::strlen(text)) == static_cast<ssize_t>(std::strlen(text));
    ::close(fd);
    return ok;
}

// Flags a bind mount from the parent namespace keeps locked: a read-only remount must repeat them.
unsigned long locked_flags(const char* path) {
    struct statvfs s {};
    if (::statvfs(path, &s) != 0) return 0;
    unsigned long f = 0;
    if (s.f_flag & ST_NOSUID) f |= MS_NOSUID;
    if (s.f_flag & ST_NODEV) f |= MS_NODEV;
    if (s.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
    if (s.f_flag & ST_NOATIME) f |= MS_NOATIME;
    if (s.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
    if (s.f_flag & ST_RELATIME) f |= MS_RELATIME;
    return f;
}

void bind_readonly(const char* src, const char* dst) {
    if (::mount(src, dst, nullptr, MS_BIND | MS_REC, nullptr) != 0) die("bind mount");
    if (::mount(nullptr, dst, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | locked_flags(src), nullptr) != 0)
        die("read-only remount");
}

// The tasks `uid` runs now: RLIMIT_NPROC counts them all, so the limit is this plus the budget.
long tasks_of(uid_t uid) {
    long n = 0;
    DIR* d = ::opendir("/proc");
    if (!d) return 0;
    while (dirent* e = ::readdir(d)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        std::ifstream st(std::string("/proc/") + e->d_name + "/status");
        std::string line;
        long threads = 1;
        bool mine = false;
        while (std::getline(st, line)) {
            if (line.rfind("Uid:", 0) == 0) mine = std::stoul(line.substr(4)) == uid;
            else if (line.rfind("Threads:", 0) == 0) threads = std::stol(line.substr(8));
        }
        if (mine) n += threads;
    }
    ::closedir(d);
    return n;
}

struct Plan {
    std::string root, work, prog;
    std::vector<std::string> argv;  // what runs in /work (argv[0] an absolute path)
    std::vector<const char*> cargv;  // argv as exec takes it, made before fork: nothing may
                                     // allocate after the rlimits (an ASan build cannot)
    uid_t uid;
    gid_t gid;
    bool drop;
    rlim_t nproc;
    SandboxLimits limits;
    char uid_map[64], gid_map[64];
};

// The status pipe carries two lines from two processes, in no fixed order: the outer child's
// "pid N" (PID 1's pid in our namespace) and PID 1's "status WAIT_STATUS CPU_SECONDS". A command
// that ends at once can have its status written before the outer child, just back from fork,
// writes the pid. Each line is one write of less than PIPE_BUF bytes, so lines never interleave.

// Grandchild: PID 1 of the new PID namespace. Builds the filesystem view, then runs the command
// as its child and reports how that ended on `status_fd`.
[[noreturn]] void run_inner(const Plan& p, int status_fd) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) die("make mounts private");
    if (::mount("tmpfs", p.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") != 0) die("tmpfs root");
    char path[4096];
    for (const char* d : {"usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc"}) {
        std::snprintf(path, sizeof path, "/%s", d);
        struct stat st {};
        if (::lstat(path, &st) != 0) continue;
        char dst[4096];
        std::snprintf(dst, sizeof dst, "%s/%s", p.root.c_str(), d);
        if (S_ISLNK(st.st_mode)) {  // merged /usr: /bin -> usr/bin
            char target[4096];
            ssize_t n = ::readlink(path, target, sizeof target - 1);
            if (n <= 0) continue;
            target[n] = 0;
            if (::symlink(target, dst) != 0) die("symlink");
        } else if (S_ISDIR(st.st_mode)) {
            if (::mkdir(dst, 0755) != 0) die("mkdir");
            bind_readonly(path, dst);
        }
    }
    char dst[4096];
    std::snprintf(dst, sizeof dst, "%s/work", p.root.c_str());
    if (::mkdir(dst, 0755) != 0) die("mkdir work");
    if (::mount(p.work.c_str(), dst, nullptr, MS_BIND, nullptr) != 0) die("bind work");
    if (::mount(nullptr, dst, nullptr, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | locked_flags(p.work.c_str()), nullptr) != 0)
        die("remount work");
    std::snprintf(dst, sizeof dst, "%s/dev", p.root.c_str());
    if (::mkdir(dst, 0755) != 0) die("mkdir dev");
    for (const char* dev : {"null", "zero", "urandom"}) {
        char src[64], to[4096];
        std::snprintf(src, sizeof src, "/dev/%s", dev);
        std::snprintf(to, sizeof to, "%s/dev/%s", p.root.c_str(), dev);
        int fd = ::open(to, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        if (fd < 0) die("create dev node");
        ::close(fd);
        if (::mount(src, to, nullptr, MS_BIND, nullptr) != 0) die("bind dev node");
    }
    std::snprintf(dst, sizeof dst, "%s/proc", p.root.c_str());
    if (::mkdir(dst, 0555) == 0 && ::mount("proc", dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
        // Containers that mask parts of /proc refuse a fresh one; Python does not need it.
    }
    if (::mount(nullptr, p.root.c_str(), nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755") != 0)
        die("read-only root");
    if (::chroot(p.root.c_str()) != 0) die("chroot");
    if (::chdir("/work") != 0) die("chdir");
    // PID 1 of the namespace stays this small init: the kernel ignores signals a process sends
    // to its namespace's init, so the program must not be PID 1 (os.kill(os.getpid(), SIGSEGV)
    // would do nothing). When this init exits, every process left in the namespace is killed.
    pid_t prog = ::fork();
    if (prog < 0) die("fork");
    if (prog == 0) {
        auto lim = [](int res, rlim_t soft, rlim_t hard) {
            rlimit r{soft, hard};
            if (::setrlimit(res, &r) != 0) die("setrlimit");
        };
        lim(RLIMIT_CPU, static_cast<rlim_t>(p.limits.cpu_s), static_cast<rlim_t>(p.limits.cpu_s) + 1);
        lim(RLIMIT_AS, p.limits.memory_bytes, p.limits.memory_bytes);
        lim(RLIMIT_FSIZE, p.limits.file_bytes, p.limits.file_bytes);
        lim(RLIMIT_NPROC, p.nproc, p.nproc);
        lim(RLIMIT_NOFILE, static_cast<rlim_t>(p.limits.open_files), static_cast<rlim_t>(p.limits.open_files));
        lim(RLIMIT_CORE, 0, 0);
        // No bytecode caches: an agent task's files go in and out of the sandbox between commands,
        // and a cache as new as a rewritten source of the same size would pass for it.
        const char* envp[] = {"PATH=/usr/bin:/bin", "HOME=/work", "TMPDIR=/work", "LANG=C.UTF-8", "PYTHONHASHSEED=0", "PYTHONDONTWRITEBYTECODE=1", nullptr};
        ::execve(p.cargv[0], const_cast<char* const*>(p.cargv.data()), const_cast<char* const*>(envp));
        die("exec");
    }
    int status = 0;
    rusage ru{};
    while (::wait4(prog, &status, 0, &ru) < 0 && errno == EINTR) {
    }
    double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    char buf[64];
    int n = std::snprintf(buf, sizeof buf, "status %d %.3f\n", status, cpu);
    ssize_t w = ::write(status_fd, buf, static_cast<size_t>(n));
    (void)w;
    ::_exit(0);
}

// Child: drops privileges, enters the namespaces, forks PID 1 and reports its pid (in our
// namespace) on `status_fd`. Exits as PID 1 did when that failed to set the sandbox up.
[[noreturn]] void run_outer(const Plan& p, int out_fd, int status_fd) {
    ::setpgid(0, 0);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_fd, 1);
    ::dup2(out_fd, 2);
    if (p.drop) {
        if (::setgroups(0, nullptr) != 0 || ::setresgid(p.gid, p.gid, p.gid) != 0 || ::setresuid(p.uid, p.uid, p.uid) != 0)
            die("drop to nobody");
        // Changing credentials cleared "dumpable", which makes /proc/self/*_map root's: restore it.
        if (::prctl(PR_SET_DUMPABLE, 1) != 0) die("dumpable");
    }
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS) != 0)
        die("unshare (user namespaces must be available)");
    if (!write_file("/proc/self/setgroups", "deny") || !write_file("/proc/self/uid_map", p.uid_map) ||
        !write_file("/proc/self/gid_map", p.gid_map))
        die("uid/gid map");
    pid_t inner = ::fork();
    if (inner < 0) die("fork");
    if (inner == 0) run_inner(p, status_fd);
    char pidline[32];
    int pn = std::snprintf(pidline, sizeof pidline, "pid %d\n", inner);
    if (::write(status_fd, pidline, static_cast<size_t>(pn)) != pn) die("status pipe");
    int status = 0;
    while (::waitpid(inner, &status, 0) < 0 && errno == EINTR) {
    }
    ::_exit(WIFEXITED(status) && WEXITSTATUS(status) == kSetupFailed ? kSetupFailed : 0);
}

}  // namespace

// Runs `argv` in the sandbox with `files` written into its work directory first; afterwards, when
// `back` is set, the work directory's regular files are read back into `files`.
static SandboxResult run_sandboxed(const std::vector<std::string>& argv, Files& files, bool back, const SandboxLimits& limits) {
    SandboxResult r;
    for (const auto& [path, text] : files) {
        fs::path rel(path);
        bool bad = path.empty() || rel.is_absolute();
        for (const auto& part : rel) bad = bad || part == "..";
        if (bad) return r.detail = "a task file path leaves the work directory: '" + path + "'", r;
    }
    std::string tmpl = (fs::temp_directory_path() / "pulse-sandbox-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) return r.detail = std::string("mkdtemp: ") + std::strerror(errno), r;
    const fs::path top(tmpl);
    struct Cleanup {
        fs::path p;
        ~Cleanup() {
            std::error_code ec;
            fs::remove_all(p, ec);
        }
    } cleanup{top};
    Plan p;
    p.root = (top / "root").string();
    p.work = (top / "work").string();
    p.limits = limits;
    p.argv = argv;
    for (const auto& a : p.argv) p.cargv.push_back(a.c_str());
    p.cargv.push_back(nullptr);
    fs::create_directories(p.root);
    fs::create_directories(p.work);
    p.drop = ::geteuid() == 0;
    p.uid = p.drop ? kNobody : ::geteuid();
    p.gid = p.drop ? kNogroup : ::getegid();
    for (const auto& [path, text] : files) {
        fs::path f = top / "work" / path;
        fs::create_directories(f.parent_path());
        std::ofstream(f, std::ios::binary) << text;
    }
    if (p.drop) {
        ::chmod(top.c_str(), 0711);
        std::error_code ec;
        for (auto it = fs::recursive_directory_iterator(top / "work", ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
            if (::chown(it->path().c_str(), p.uid, p.gid) != 0) return r.detail = std::string("chown work files: ") + std::strerror(errno), r;
        if (::chown(p.work.c_str(), p.uid, p.gid) != 0) return r.detail = std::string("chown work dir: ") + std::strerror(errno), r;
    }
    p.nproc = static_cast<rlim_t>(tasks_of(p.uid) + limits.processes);
    std::snprintf(p.uid_map, sizeof p.uid_map, "0 %u 1\n", p.uid);
    std::snprintf(p.gid_map, sizeof p.gid_map, "0 %u 1\n", p.gid);

    int out[2], st[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return r.detail = "pipe", r;
    if (::pipe2(st, O_CLOEXEC) != 0) {
        ::close(out[0]);
        ::close(out[1]);
        return r.detail = "pipe", r;
    }
    // Orphans of the sandbox (its PID 1 once the outer child is gone) come back to us to be
    // reaped, instead of becoming zombies where init does not reap (containers).
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    const auto t0 = std::chrono::steady_clock::now();
    pid_t pid = ::fork();
    if (pid < 0) {
        for (int fd : {out[0], out[1], st[0], st[1]}) ::close(fd);
        return r.detail = "fork", r;
    }
    if (pid == 0) {
        ::close(out[0]);
        ::close(st[0]);
        run_outer(p, out[1], st[1]);
    }
    ::setpgid(pid, pid);
    ::close(out[1]);
    ::close(st[1]);
    constexpr size_t kMaxOutput = 64 * 1024;
    bool timed_out = false, eof = false;
    const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(limits.wall_s));
    char buf[8192];
    while (!eof) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        pollfd pf{out[0], POLLIN, 0};
        int n = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 200)));
        if (n < 0 && errno != EINTR) break;
        if (n > 0) {
            ssize_t k = ::read(out[0], buf, sizeof buf);
            if (k > 0 && r.output.size() < kMaxOutput) r.output.append(buf, std::min(static_cast<size_t>(k), kMaxOutput - r.output.size()));
            if (k == 0) eof = true;
        }
    }
    // The process group, and with PID 1 of the namespace every process in it (PDEATHSIG chain).
    ::kill(-pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(out[0]);
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string report;
    while (true) {
        ssize_t k = ::read(st[0], buf, sizeof buf);
        if (k <= 0) break;
        report.append(buf, static_cast<size_t>(k));
    }
    ::close(st[0]);
    long inner_pid = 0;
    int inner = 0;
    bool have_status = false;
    for (size_t at = 0; at < report.size();) {
        size_t nl = report.find('\n', at);
        if (nl == std::string::npos) break;  // a line cut short by a process killed mid-write
        const std::string line = report.substr(at, nl - at);
        at = nl + 1;
        if (std::sscanf(line.c_str(), "pid %ld", &inner_pid) == 1) continue;
        if (std::sscanf(line.c_str(), "status %d %lf", &inner, &r.cpu_s) == 2) have_status = true;
    }
    // Reap the sandbox's PID 1: killed with the group, it comes back to us (subreaper).
    if (inner_pid > 0)
        for (int i = 0; i < 100 && ::waitpid(static_cast<pid_t>(inner_pid), nullptr, WNOHANG) == 0; ++i) ::usleep(2000);
    if (back) {
        // What the command left: regular files only (no links out of the tree), bounded.
        Files now;
        std::error_code ec;
        const fs::path work = top / "work";
        for (auto it = fs::recursive_directory_iterator(work, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
            if (!it->is_regular_file(ec) || it->is_symlink(ec) || now.size() >= 256) continue;
            if (fs::file_size(it->path(), ec) > (1u << 20)) continue;
            std::ifstream in(it->path(), std::ios::binary);
            now[fs::relative(it->path(), work).string()] = std::string(std::istreambuf_iterator<char>(in), {});
        }
        files = std::move(now);
    }
    if (timed_out) {
        r.outcome = Outcome::timeout;
        r.detail = "wall timeout after " + std::to_string(static_cast<int>(limits.wall_s)) + " s";
        return r;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == kSetupFailed) {
        r.outcome = Outcome::error;
        r.detail = "sandbox set-up failed: " + r.output.substr(0, 300);
        return r;
    }
    if (!have_status) {
        r.outcome = Outcome::error;
        r.detail = "no status from the sandbox" + (r.output.empty() ? std::string() : ": " + r.output.substr(0, 300));
        return r;
    }
    if (WIFEXITED(inner)) {
        r.exit_code = WEXITSTATUS(inner);
        if (r.exit_code == kSetupFailed && r.output.find("sandbox: ") != std::string::npos) {
            r.outcome = Outcome::error;
            r.detail = "sandbox set-up failed: " + r.output.substr(r.output.find("sandbox: "), 300);
        } else {
            r.outcome = r.exit_code == 0 ? Outcome::passed : Outcome::failed;
        }
    } else if (WIFSIGNALED(inner)) {
        r.signal = WTERMSIG(inner);
        bool cpu_limit = r.signal == SIGXCPU || (r.signal == SIGKILL && r.cpu_s >= limits.cpu_s - 0.1);
        r.outcome = cpu_limit ? Outcome::timeout : Outcome::crashed;
        r.detail = cpu_limit ? "CPU limit (" + std::to_string(limits.cpu_s) + " s)" : "signal " + std::to_string(r.signal) + " (" + strsignal(r.signal) + ")";
    }
    return r;
}

SandboxResult run_python_sandboxed(const std::string& program, const SandboxLimits& limits) {
    Files files{{"prog.py", program}};
    return run_sandboxed({"/usr/bin/python3", "-I", "-B", "prog.py"}, files, false, limits);
}

SandboxResult run_shell_sandboxed(const std::string& command, Files& files, const SandboxLimits& limits) {
    return run_sandboxed({"/bin/sh", "-c", command}, files, true, limits);
}

}  // namespace pulse::bench
