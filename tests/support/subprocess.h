// Runs a program the way a user would, capturing stdout, stderr and the exit code. Bounded:
// a child still running after `timeout_s` is killed and reported as exit code -1.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.h"

extern char** environ;

namespace pulse::test {

struct Result {
    int code = -1;
    std::string out, err;
};

class Child {
public:
    // Starts `argv` with extra environment `env` (added to this process's environment).
    Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {}) {
        out_ = dir_ / "stdout";
        err_ = dir_ / "stderr";
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_addopen(&fa, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        std::vector<std::string> envs;
        for (char** e = environ; *e; ++e) {
            std::string s(*e);
            if (!env.count(s.substr(0, s.find('=')))) envs.push_back(s);
        }
        for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
        std::vector<char*> av, ev;
        for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
        av.push_back(nullptr);
        for (auto& e : envs) ev.push_back(e.data());
        ev.push_back(nullptr);
        // spawnp: a bare name ("bash") is looked up in PATH, as a shell would.
        if (posix_spawnp(&pid_, av[0], &fa, nullptr, av.data(), ev.data()) != 0) pid_ = -1;
        posix_spawn_file_actions_destroy(&fa);
    }
    ~Child() {
        if (pid_ > 0 && !done_) {
            ::kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }

    void signal(int sig) { if (pid_ > 0 && !done_) ::kill(pid_, sig); }
    pid_t pid() const { return pid_; }

    Result wait(double timeout_s = 30) {
        Result r;
        auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
        int status = 0;
        while (pid_ > 0 && !done_) {
            pid_t p = waitpid(pid_, &status, WNOHANG);
            if (p == pid_) {
                done_ = true;
                r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                break;
            }
            if (std::chrono::steady_clock::now() > until) {
                ::kill(pid_, SIGKILL);
                waitpid(pid_, nullptr, 0);
                done_ = true;
                r.code = -1;
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        r.out = read_file(out_);
        r.err = read_file(err_);
        return r;
    }

    std::string stderr_so_far() const { return read_file(err_); }
    std::string stdout_so_far() const { return read_file(out_); }
    bool running() {
        if (pid_ <= 0 || done_) return false;
        int status;
        return waitpid(pid_, &status, WNOHANG) == 0;
    }

private:
    TempDir dir_;
    std::filesystem::path out_, err_;
    pid_t pid_ = -1;
    bool done_ = false;
};

inline Result run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                  double timeout_s = 30) {
    Child c(argv, env);
    return c.wait(timeout_s);
}

}  // namespace pulse::test
