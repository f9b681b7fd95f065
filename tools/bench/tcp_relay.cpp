// The floor for any HTTP gateway on this machine: a byte relay that parses nothing. One epoll
// thread; each accepted client connection gets its own connection to the target, and bytes are
// copied both ways with one recv and one send per arrival, as a gateway must at least do per
// streamed token. gateway_overhead runs it as a third arm, so Pulse's CPU per token can be read
// against what the kernel alone costs for the same relay hop, in the same run.
//
//   tcp_relay --to PORT        (listens on 127.0.0.1, an ephemeral port, printed on stdout)
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "args/args.h"

namespace {

struct Pair;
struct Side {
    int fd = -1;
    Pair* pair = nullptr;
    Side* peer = nullptr;
    std::string pending;  // bytes for this side that its socket has not taken yet
    bool want_out = false;
};
struct Pair {
    Side client, target;
};

int ep = -1;

void watch(Side& s, bool out) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0u);
    ev.data.ptr = &s;
    ::epoll_ctl(ep, EPOLL_CTL_MOD, s.fd, &ev);
    s.want_out = out;
}

// Sends what `to` has pending; false when its socket failed.
bool push(Side& to) {
    while (!to.pending.empty()) {
        ssize_t n = ::send(to.fd, to.pending.data(), to.pending.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            to.pending.erase(0, static_cast<size_t>(n));
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!to.want_out) watch(to, true);
            return true;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            return false;
        }
    }
    if (to.want_out) watch(to, false);
    return true;
}

// Returns false when the pair is over (EOF or error on either side).
bool relay(Side& from) {
    char buf[65536];
    for (;;) {
        ssize_t n = ::recv(from.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            from.peer->pending.append(buf, static_cast<size_t>(n));
            if (!push(*from.peer)) return false;
            if (static_cast<size_t>(n) < sizeof buf) return true;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return true;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            return false;
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    int to_port = 0;
    CLI::App app{"A byte relay on a loopback port to 127.0.0.1:PORT: the floor of a relay hop for gateway_overhead.", "tcp_relay"};
    pulse::args::style(app);
    app.add_option("--to", to_port, "the port relayed to")->option_text("PORT")->required()->check(CLI::Range(1, 65535));
    if (auto exit = pulse::args::parse(app, argc, argv)) return *exit;
    ::signal(SIGPIPE, SIG_IGN);
    sockaddr_in target{};
    target.sin_family = AF_INET;
    target.sin_port = htons(static_cast<uint16_t>(to_port));
    target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof addr;
    if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(ls, 1024) != 0 ||
        ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) {
        std::perror("tcp_relay: listen");
        return 1;
    }
    std::printf("listening on 127.0.0.1:%d\n", ntohs(addr.sin_port));
    std::fflush(stdout);

    ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event lev{};
    lev.events = EPOLLIN;
    lev.data.ptr = nullptr;  // the listening socket
    ::epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev);
    epoll_event evs[256];
    std::vector<Pair*> dead;
    for (;;) {
        int n = ::epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; ++i) {
            if (!evs[i].data.ptr) {
                for (;;) {
                    int c = ::accept4(ls, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (c < 0) break;
                    // A blocking connect on loopback is immediate; the socket is made
                    // non-blocking after.
                    int t = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                    if (::connect(t, reinterpret_cast<sockaddr*>(&target), sizeof target) != 0) {
                        ::close(c);
                        ::close(t);
                        continue;
                    }
                    ::fcntl(t, F_SETFL, ::fcntl(t, F_GETFL) | O_NONBLOCK);
                    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    ::setsockopt(t, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    auto* p = new Pair;
                    p->client = {c, p, &p->target, {}, false};
                    p->target = {t, p, &p->client, {}, false};
                    for (Side* s : {&p->client, &p->target}) {
                        epoll_event ev{};
                        ev.events = EPOLLIN | EPOLLRDHUP;
                        ev.data.ptr = s;
                        ::epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev);
                    }
                }
                continue;
            }
            auto* s = static_cast<Side*>(evs[i].data.ptr);
            if (s->fd < 0) continue;  // its pair closed earlier in this batch
            bool ok = true;
            if (evs[i].events & EPOLLOUT) ok = push(*s);
            if (ok && (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) ok = relay(*s);
            if (!ok) {
                // Later events of this batch may name either side: freed after the batch.
                Pair* p = s->pair;
                ::close(p->client.fd);
                ::close(p->target.fd);
                p->client.fd = p->target.fd = -1;
                dead.push_back(p);
            }
        }
        for (Pair* p : dead) delete p;
        dead.clear();
    }
}
