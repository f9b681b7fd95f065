// Turns a translation profile's normalized deltas into Responses API events, with everything
// the protocol requires: ids, output_index / content_index / summary_index, sequence_number,
// added -> deltas -> done for every item, exactly one terminal event, and usage.
//
// The builder is the host's pulse_delta_sink: profiles call it through the delta table.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/protocol/answer_ledger.h"
#include "gateway/protocol/item_events.h"
#include "gateway/protocol/response_json.h"
#include "plugin/host_api.h"

namespace pulse::gateway {

enum class ReasoningOutput { summary, raw, both };

class ResponseBuilder : public pulse_delta_sink {
public:
    // `emit(type, json)` receives each event in order (the SSE writer, or nothing for a
    // non-streaming response); `json` is valid during the call only.
    using Emit = std::function<void(std::string_view type, std::string_view json)>;

    ResponseBuilder(std::string response_id, std::string model, ReasoningOutput reasoning, Emit emit);
    ~ResponseBuilder() override;

    // response.created + response.in_progress.
    void start();
    // A keepalive: another response.in_progress (resets Codex's idle timer; comments do not).
    void keepalive();

    // pulse_delta_sink
    pulse_status_t text(std::string_view t) override;
    pulse_status_t reasoning(std::string_view t) override;
    pulse_status_t tool_begin(uint32_t index, pulse_tool_kind_t kind, std::string_view call_id, std::string_view name,
                              std::string_view ns) override;
    pulse_status_t tool_args(uint32_t index, std::string_view fragment) override;
    pulse_status_t tool_end(uint32_t index) override;
    pulse_status_t finish(pulse_finish_t reason) override;
    pulse_status_t usage(const pulse_usage_t& u) override;
    pulse_status_t error(pulse_status_t status, std::string_view message) override;
    pulse_status_t trail(const int32_t* tokens, size_t n, std::string_view raw) override;
    pulse_status_t trail_lost(std::string_view why) override;

    // How a response ended: its terminal event (response.completed, .incomplete, .failed).
    enum class Ending { none, completed, incomplete, failed };
    // Ends the response with exactly one terminal event. `how` says how the upstream ended;
    // an error recorded earlier (error()) wins. Returns how it ended (none: it had already).
    Ending end(pulse_stream_end_t how, std::string_view truncation_reason = {});
    // Fails the response with a message (profile error, backend failure after acceptance).
    void fail(pulse_status_t status, std::string_view message);

    // Mid-stream resume. What the client has of the answer, if the response can be continued
    // from there: not ended, and no tool call shown (a call is delivered whole or not at all,
    // and no backend continues one from inside its arguments).
    struct Partial {
        std::string text, reasoning;
        // The backends' token record of the whole answer so far (delta->trail), when every
        // attempt reported one without a hole; else why not (empty: no backend reported one).
        std::optional<std::pair<std::vector<int32_t>, std::string>> trail;
        std::string no_trail;
    };
    std::optional<Partial> resume_point() const;
    bool can_resume() const;  // resume_point() would have a value (no copy of the output)
    // The next deltas continue this response from another backend: the recorded failure is
    // dropped, the open item stays open (text continues it), and the failed attempt's usage is
    // carried into the totals: what its backend reported, else its output deltas as tokens.
    void begin_resume();
    // True once the current backend attempt added output (all of them: has_output()).
    bool attempt_has_output() const { return ledger_.attempt_has_output(); }
    // A stream that starts the answer afresh (not a continuation): the token record restarts.
    void restart_trail() { ledger_.restart_trail(); }

    bool started() const { return started_; }
    bool ended() const { return ended_; }
    // True once anything beyond created/in_progress went out (no retry after that).
    bool has_output() const { return has_output_; }
    // The final Response object (for non-streaming clients), valid after end()/fail().
    const std::string& final_response() const { return final_; }
    const std::string& id() const { return id_; }

    using Usage = AnswerLedger::Usage;
    // What the backends reported, over every attempt (an earlier attempt that reported nothing
    // counts its output deltas as tokens: begin_resume).
    Usage usage_totals() const { return ledger_.totals(); }
    // Output (and reasoning) tokens every attempt spent so far, this one counted from its
    // deltas when its backend has not reported usage: what a continuation may no longer spend.
    Usage spent() const { return ledger_.spent(); }
    // The error a failed response carried (status and message), if any.
    std::optional<std::pair<pulse_status_t, std::string>> failure() const { return failure_; }

private:
    using Item = OutputItem;

    Item& open_item(Item::Type type, const std::function<void(Item&)>& fill = {});
    void close_current();
    void close_item(size_t index);
    std::string response_json(std::string_view status, bool terminal) const;
    void event(std::string_view type, const std::function<void(JsonOut&)>& body);
    ItemEmitter emitter();  // event(), for item_events
    std::string new_call_id();

    std::string id_, model_;
    ReasoningOutput reasoning_mode_;
    Emit emit_;
    std::unique_ptr<JsonOut> out_;  // one event's JSON, reused: no allocation per event once warm
    int64_t created_at_;
    uint64_t seq_ = 0;
    std::vector<Item> items_;
    std::optional<size_t> current_;  // index of the open message/reasoning/tool item
    std::optional<pulse_finish_t> finish_;
    std::optional<std::pair<pulse_status_t, std::string>> failure_;
    std::optional<std::string> incomplete_reason_;
    AnswerLedger ledger_;  // usage and the token record, over every attempt
    std::string final_;
    bool started_ = false, ended_ = false, has_output_ = false;
    uint32_t call_counter_ = 0;
};

}  // namespace pulse::gateway
