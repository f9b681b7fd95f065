#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>

namespace pulse::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::info)};
std::mutex g_mutex;

bool timestamps() {
    static const bool on = [] {
        const char* v = std::getenv("PULSE_LOG_TIMESTAMPS");
        return !(v && std::string_view(v) == "0");
    }();
    return on;
}

const char* name(Level l) {
    switch (l) {
        case Level::trace: return "TRACE";
        case Level::debug: return "DEBUG";
        case Level::info: return "INFO";
        case Level::warn: return "WARN";
        case Level::error: return "ERROR";
        default: return "?";
    }
}
}  // namespace

void set_level(Level level) { g_level.store(static_cast<int>(level)); }
Level level() { return static_cast<Level>(g_level.load()); }
bool enabled(Level l) { return static_cast<int>(l) >= g_level.load(std::memory_order_relaxed); }

bool parse_level(std::string_view t, Level& out) {
    static const std::pair<std::string_view, Level> names[] = {
        {"trace", Level::trace}, {"debug", Level::debug}, {"info", Level::info},
        {"warn", Level::warn},   {"error", Level::error}, {"off", Level::off}};
    for (const auto& [n, l] : names)
        if (n == t) { out = l; return true; }
    return false;
}

void write(Level l, std::string_view component, std::string_view message) {
    if (!enabled(l)) return;
    std::string line;
    line.reserve(message.size() + 64);
    if (timestamps()) {
        auto now = std::chrono::system_clock::now();
        std::time_t t = std::chrono::system_clock::to_time_t(now);
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
        std::tm tm{};
        gmtime_r(&t, &tm);
        char buf[64];
        std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ ", tm.tm_year + 1900,
                      tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
        line += buf;
    }
    line += name(l);
    line += ' ';
    line += component;
    line += ": ";
    line += message;
    line += '\n';
    std::lock_guard lock(g_mutex);
    std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace pulse::log
