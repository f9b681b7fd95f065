#include "gateway/background/slot_keeper.h"

#include <cctype>

#include "common/log.h"
#include "common/metrics.h"
#include "gateway/upstream/upstream.h"

namespace pulse::gateway {

using namespace std::chrono;

SlotKeeper::Slots SlotKeeper::get(const std::string& url) {
    std::lock_guard lock(m_);
    return slots_[url];
}

void SlotKeeper::put(const std::string& url, const Slots& s) {
    std::lock_guard lock(m_);
    slots_[url] = s;
}

bool SlotKeeper::want_save(const config::Endpoint& ep, const BackendDialect& dialect) {
    if (ep.is_plugin() || !dialect.persists()) return false;
    std::lock_guard lock(m_);
    Slots& st = slots_[ep.url];
    if (st.unsupported || st.total < 0 || st.pending) return false;
    st.pending = true;
    return true;
}

std::string SlotKeeper::slot_file(const config::Endpoint& ep, int slot) {
    // The endpoint's name, reduced to what the SDK promises a file name holds.
    std::string name;
    for (char c : ep.name) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
    return "pulse-" + name + "-slot" + std::to_string(slot) + ".bin";
}

pulse_status_t SlotKeeper::ask(const config::Endpoint& ep, const BackendDialect& dialect, pulse_cache_op_t op, int slot, int* n, std::string* why) {
    pulse_status_t rc;
    auto req = dialect.cache_request(op, slot, op == PULSE_CACHE_COUNT ? std::string() : slot_file(ep, slot), &rc, why);
    if (!req) return rc;
    // Writing or reading a slot file takes the server a while for a long prompt.
    const double t = op == PULSE_CACHE_COUNT ? timeouts_.connect_timeout_s : std::max(30.0, timeouts_.connect_timeout_s);
    std::string answer;
    int status = exchange_blocking(ep, *req, http::Timeouts{timeouts_.connect_timeout_s, 30, t}, 65536, &answer);
    if (status == 0) {
        *why = "no answer: " + answer;
        return PULSE_E_UNAVAILABLE;
    }
    return dialect.cache_answer(op, status, answer, n, why);
}

int SlotKeeper::count(const config::Endpoint& ep, const BackendDialect& dialect) {
    int n = -1;
    std::string why;
    return ask(ep, dialect, PULSE_CACHE_COUNT, 0, &n, &why) == PULSE_OK && n > 0 ? n : -1;
}

void SlotKeeper::save(const config::Endpoint& ep, const EndpointHealth& health, const BackendDialect& dialect,
                      const std::function<bool(steady_clock::time_point)>& pause) {
    Slots st = get(ep.url);
    for (const auto bound = steady_clock::now() + minutes(1); steady_clock::now() < bound;) {
        const bool busy = health.in_flight.load() > 0;
        const auto due = st.last_save + save_interval_;
        if (!busy && steady_clock::now() >= due) break;
        if (!pause(busy ? bound : std::min(bound, due))) return;  // busy: woken when a request ends
    }
    auto done = [&](Slots s) {
        s.pending = false;
        put(ep.url, s);
    };
    if (health.in_flight.load() > 0 || !health.healthy()) return done(st);
    if (st.total == 0) st.total = count(ep, dialect);
    if (st.total <= 0) return done(st);  // nothing the profile can persist
    for (int slot = 0; slot < st.total; ++slot) {
        std::string why;
        pulse_status_t rc = ask(ep, dialect, PULSE_CACHE_SAVE, slot, nullptr, &why);
        if (rc == PULSE_E_UNSUPPORTED) {
            st.unsupported = true;  // said once, not asked again
            log::info("warmup", "endpoint " + ep.name + " cannot save its slots (" + why + "); its recovery replays prompts instead");
            return done(st);
        }
        if (rc != PULSE_OK) {
            log::warn("warmup", "endpoint " + ep.name + ": saving slot " + std::to_string(slot) + " failed: " + why.substr(0, 300));
            return done(st);
        }
    }
    st.saved = true;
    st.last_save = steady_clock::now();
    metrics::global().counter("pulse_slot_saves_total", "saves of a backend's cache slots (e.g. llama-server --slot-save-path)", {{"endpoint", ep.name}}).add();
    log::debug("warmup", "endpoint " + ep.name + ": saved " + std::to_string(st.total) + " slots");
    done(st);
}

bool SlotKeeper::recover(const config::Endpoint& ep, const BackendDialect& dialect) {
    if (!dialect.persists()) return false;
    const Slots st = get(ep.url);
    const int now_total = count(ep, dialect);
    {
        std::lock_guard lock(m_);
        slots_[ep.url].total = now_total;  // what its next save covers
    }
    if (!st.saved || st.total <= 0) return false;
    // The server may have come back with fewer slots (-np 2, then -np 1): a slot it does not have
    // cannot take a restore, so only the ones it has are asked for.
    const int asked = now_total > 0 ? std::min(now_total, st.total) : st.total;
    if (asked < st.total)
        log::info("warmup", "endpoint " + ep.name + " came back with " + std::to_string(now_total) + " slots, " + std::to_string(st.total) +
                                " were saved: restoring the first " + std::to_string(asked));
    int restored = 0;
    for (int slot = 0; slot < asked; ++slot) {
        std::string why;
        if (ask(ep, dialect, PULSE_CACHE_RESTORE, slot, nullptr, &why) == PULSE_OK) ++restored;
        else log::warn("warmup", "endpoint " + ep.name + ": restoring slot " + std::to_string(slot) + " failed: " + why.substr(0, 300));
    }
    metrics::global().counter("pulse_slot_restores_total", "backend cache slots loaded from their files after a restart", {{"endpoint", ep.name}}).add(restored);
    if (restored == 0) return false;
    // Loaded is not reused: what a slot holds helps only a prompt that extends it (on a hybrid
    // model exactly), so the replays that follow and the first real request say what it was worth.
    log::info("warmup", "endpoint " + ep.name + " is back: loaded " + std::to_string(restored) + " of " + std::to_string(asked) +
                            " saved slots; the replays show how much of them their prompts reuse");
    return true;
}

}  // namespace pulse::gateway
