// Process-wide logger. One line per record on stderr (journald adds its own timestamp when
// running under systemd, so PULSE_LOG_TIMESTAMPS=0 is set there).
#pragma once

#include <string_view>

namespace pulse::log {

enum class Level : int { trace = 0, debug = 1, info = 2, warn = 3, error = 4, off = 5 };

void set_level(Level level);
Level level();
bool enabled(Level level);
// Parses "trace|debug|info|warn|error|off"; returns false for anything else.
bool parse_level(std::string_view text, Level& out);

void write(Level level, std::string_view component, std::string_view message);

inline void info(std::string_view component, std::string_view m) { write(Level::info, component, m); }
inline void warn(std::string_view component, std::string_view m) { write(Level::warn, component, m); }
inline void error(std::string_view component, std::string_view m) { write(Level::error, component, m); }
inline void debug(std::string_view component, std::string_view m) { write(Level::debug, component, m); }

}  // namespace pulse::log
