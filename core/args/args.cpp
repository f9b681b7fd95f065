#include "args/args.h"

#include <algorithm>
#include <cstdio>

namespace pulse::args {

namespace {

// The subcommand the parse reached: the last selected one, followed down from the root.
const CLI::App& deepest(const CLI::App& app) {
    const CLI::App* at = &app;
    for (;;) {
        auto subs = at->get_subcommands();
        if (subs.empty()) return *at;
        at = subs.back();
    }
}

void print(const std::function<void(const std::string&)>& to, FILE* otherwise, const std::string& text) {
    if (to) to(text);
    else std::fputs(text.c_str(), otherwise);
}

std::optional<int> handle(CLI::App& app, const CLI::ParseError& e, const Output& to) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {  // --help, --version
        const bool help = dynamic_cast<const CLI::CallForHelp*>(&e) || dynamic_cast<const CLI::CallForAllHelp*>(&e);
        print(to.out, stdout, help ? app.help() : std::string(e.what()) + "\n");
        return 0;
    }
    return usage_error(deepest(app), e.what(), to);
}

}  // namespace

void style(CLI::App& app) {
    auto f = std::make_shared<CLI::Formatter>();
    f->label("Usage", "usage");
    f->label("OPTIONS", "options");
    f->label("SUBCOMMAND", "command");
    f->label("SUBCOMMANDS", "command");
    f->label("REQUIRED", "(required)");
    f->column_width(34);
    app.formatter(f);
    app.option_defaults()->always_capture_default(false);
}

std::optional<int> parse(CLI::App& app, int argc, const char* const* argv, const Output& to) {
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        return handle(app, e, to);
    }
}

std::optional<int> parse(CLI::App& app, std::vector<std::string> args, const Output& to) {
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    try {
        app.parse(args);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        return handle(app, e, to);
    }
}

std::string command_path(const CLI::App& app) {
    std::string path = app.get_name();
    for (const CLI::App* p = app.get_parent(); p; p = p->get_parent())
        if (!p->get_name().empty()) path = p->get_name() + " " + path;
    return path;
}

int usage_error(const CLI::App& app, const std::string& message, const Output& to) {
    const std::string path = command_path(app);
    print(to.err, stderr, path + ": " + message + "\n(`" + path + " --help` shows the usage)\n");
    return kExitUsage;
}

}  // namespace pulse::args
