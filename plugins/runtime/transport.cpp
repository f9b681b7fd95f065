#include "transport.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstring>
#include <optional>

namespace pulse::runtime {

namespace {

using Clock = std::chrono::steady_clock;

class ProcessTransport : public Transport {
public:
    explicit ProcessTransport(std::vector<std::string> argv) : argv_(std::move(argv)) {}
    RunResult run(const std::string& script, double timeout_s) override { return run_process(argv_, script, timeout_s); }
    std::string describe() const override {
        std::string s;
        for (const auto& a : argv_) s += (s.empty() ? "" : " ") + a;
        return s;
    }

private:
    std::vector<std::string> argv_;
};

// A script that exits before reading all of its stdin (bash -s reads line by line) leaves a
// closed pipe: EPIPE is the answer, never a SIGPIPE that kills the host process. The signal is
// blocked for this thread and a pending one consumed, so the process-wide disposition stays.
ssize_t write_no_sigpipe(int fd, const char* data, size_t len) {
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    ssize_t k = ::write(fd, data, len);
    int saved = errno;
    if (k < 0 && errno == EPIPE) {
        timespec zero{0, 0};
        while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    errno = saved;
    return k;
}

// Forks and runs argv with `stdin_fd` as its input and `output_fd` as its stdout and stderr, in a
// process group of its own (a timeout kills everything it started in the foreground). -1 (errno
// set) when it could not fork.
pid_t start_child(const std::vector<std::string>& argv, int stdin_fd, int output_fd) {
    std::vector<char*> cargv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid != 0) {
        if (pid > 0) ::setpgid(pid, pid);
        return pid;
    }
    ::setpgid(0, 0);
    ::dup2(stdin_fd, 0);
    ::dup2(output_fd, 1);
    ::dup2(output_fd, 2);
    ::signal(SIGPIPE, SIG_DFL);
    ::execvp(cargv[0], cargv.data());
    const char msg[] = "cannot execute the transport command\n";
    ssize_t n = ::write(2, msg, sizeof msg - 1);
    (void)n;
    ::_exit(127);
}

}  // namespace

RunResult run_process(const std::vector<std::string>& argv, const std::string& input, double timeout_s) {
    RunResult r;
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return r.spawn_error = std::strerror(errno), r;
    if (::pipe2(out, O_CLOEXEC) != 0) {
        ::close(in[0]);
        ::close(in[1]);
        return r.spawn_error = std::strerror(errno), r;
    }
    const pid_t pid = start_child(argv, in[0], out[1]);
    if (pid < 0) {
        for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
        return r.spawn_error = std::strerror(errno), r;
    }
    ::close(in[0]);
    ::close(out[1]);
    ::fcntl(in[1], F_SETFL, O_NONBLOCK);
    size_t written = 0;
    if (input.empty()) ::close(in[1]), in[1] = -1;
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    std::optional<Clock::time_point> exited_at;
    int status = 0;
    bool reaped = false, eof = false;
    char buf[8192];
    while (!(reaped && eof)) {
        auto now = Clock::now();
        if (!reaped) {
            pid_t w = ::waitpid(pid, &status, WNOHANG);
            if (w == pid) reaped = true, exited_at = now;
        }
        // Output held open by a background child must not hold us past its parent's exit.
        if (exited_at && now - *exited_at > std::chrono::milliseconds(500)) break;
        if (!reaped && now >= deadline) {
            r.timed_out = true;
            ::kill(-pid, SIGTERM);
            auto grace = Clock::now() + std::chrono::seconds(2);
            while (::waitpid(pid, &status, WNOHANG) == 0 && Clock::now() < grace) ::usleep(20000);
            ::kill(-pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            reaped = true;
            break;
        }
        pollfd p[2] = {{eof ? -1 : out[0], POLLIN, 0}, {in[1], POLLOUT, 0}};
        nfds_t np = 2;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
        int wait_ms = static_cast<int>(std::clamp<long long>(left, 1, 50));
        int n = ::poll(p, np, wait_ms);
        if (n < 0 && errno != EINTR) break;
        if (in[1] >= 0 && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = write_no_sigpipe(in[1], input.data() + written, input.size() - written);
            if (k > 0) written += static_cast<size_t>(k);
            if (k < 0 && errno != EAGAIN && errno != EINTR) written = input.size();
            if (written >= input.size()) ::close(in[1]), in[1] = -1;
        }
        if (!eof && p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t k = ::read(out[0], buf, sizeof buf);
            if (k > 0) r.output.append(buf, static_cast<size_t>(k));
            else if (k == 0) eof = true;
        }
    }
    if (in[1] >= 0) ::close(in[1]);
    ::close(out[0]);
    if (!reaped) ::waitpid(pid, &status, 0);
    if (!r.timed_out && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    return r;
}

std::unique_ptr<Transport> make_transport(const Node& node) {
    if (node.local()) return std::make_unique<ProcessTransport>(std::vector<std::string>{"bash", "-s"});
    std::vector<std::string> argv = {"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"};
    argv.insert(argv.end(), node.ssh_options.begin(), node.ssh_options.end());
    argv.push_back(node.ssh);
    argv.push_back("bash");
    argv.push_back("-s");
    return std::make_unique<ProcessTransport>(std::move(argv));
}

}  // namespace pulse::runtime
