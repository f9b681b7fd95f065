// The Qwen3.5 chat format, written for this template family (no general Jinja engine):
// rendering Chat Completions messages + tools into the prompt, and parsing what the model
// writes back (a <think> block, text, and Qwen XML tool calls) into Chat Completions deltas.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <rapidjson/document.h>

namespace pulse::qwen {

// `request` is a Chat Completions body: messages (system/developer, user, assistant with
// content, reasoning_content and tool_calls, tool), tools, chat_template_kwargs.enable_thinking
// (default true). The prompt ends with the assistant generation prompt: "<think>\n" when
// thinking, "<think>\n\n</think>\n\n" when not. With continue_final_message: true (and
// add_generation_prompt: false) the last message, an assistant message, is continued instead:
// inside its reasoning when it has reasoning and no content, else after its content. `thinking`
// says whether the output starts inside a <think> block. Throws std::invalid_argument for a
// message it cannot render (an unknown role, tool_calls with unparsable arguments).
std::string render_chat(const rapidjson::Value& request, bool* thinking = nullptr);

// Incremental parser of the model's output. Feed text as it is generated; it returns what can
// be emitted now and holds back what could still be the start of a tag.
class OutputParser {
public:
    struct Event {
        enum Kind { reasoning, content, tool_call } kind;
        std::string text;       // reasoning / content
        std::string name;       // tool_call
        std::string arguments;  // tool_call: a JSON object
    };
    // `tools`: the request's tools (for typing parameter values by their JSON schema; may be
    // null). `thinking`: the prompt opened a <think> block.
    OutputParser(const rapidjson::Value* tools, bool thinking);
    std::vector<Event> feed(const std::string& text);
    std::vector<Event> finish();  // end of generation: flush; an unterminated call is dropped
    bool saw_tool_call() const { return calls_ > 0; }
    // Inside the <think> block (what is generated now is reasoning).
    bool thinking() const { return state_ == think; }
    bool broken_call() const { return broken_; }

private:
    void run(std::vector<Event>& out, bool final);
    Event parse_call(const std::string& body);

    rapidjson::Document tools_;
    enum State { think, text, call } state_;
    std::string buf_;
    int calls_ = 0;
    bool broken_ = false;
    bool strip_newlines_ = false;
};

}  // namespace pulse::qwen
