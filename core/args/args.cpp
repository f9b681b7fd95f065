#include "args/args.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace pulse::args {

namespace {

constexpr size_t kColumn = 34, kWidth = 100;  // where descriptions start; the line length they wrap at

// Words refilled to lines of at most `width` characters; the formatter indents the lines after
// the first to the description column.
std::string wrap(const std::string& text, size_t width) {
    std::string out, line, word;
    std::istringstream words(text);
    while (words >> word) {
        if (!line.empty() && line.size() + 1 + word.size() > width) {
            out += line + "\n";
            line.clear();
        }
        line += (line.empty() ? "" : " ") + word;
    }
    return out + line;
}

// CLI11's layout, with long descriptions wrapped under their column instead of running on.
class Formatter : public CLI::Formatter {
public:
    std::string make_option_desc(const CLI::Option* o) const override { return wrap(CLI::Formatter::make_option_desc(o), kWidth - kColumn); }
    std::string make_subcommand(const CLI::App* sub) const override {
        std::stringstream out;
        CLI::detail::format_help(out, sub->get_display_name(true), wrap(sub->get_description(), kWidth - kColumn), column_width_);
        return out.str();
    }
};

// "pulse serve": the app's name preceded by its parents'.
std::string command_path(const CLI::App& app) {
    std::string path = app.get_name();
    for (const CLI::App* p = app.get_parent(); p; p = p->get_parent())
        if (!p->get_name().empty()) path = p->get_name() + " " + path;
    return path;
}

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
    auto f = std::make_shared<Formatter>();
    f->label("Usage", "usage");
    f->label("OPTIONS", "options");
    f->label("SUBCOMMAND", "command");
    f->label("SUBCOMMANDS", "command");
    f->label("REQUIRED", "(required)");
    f->column_width(kColumn);
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


int usage_error(const CLI::App& app, const std::string& message, const Output& to) {
    const std::string path = command_path(app);
    print(to.err, stderr, path + ": " + message + "\n(`" + path + " --help` shows the usage)\n");
    return kExitUsage;
}

}  // namespace pulse::args
