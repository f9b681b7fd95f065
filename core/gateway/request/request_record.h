// What is kept of a /v1/responses request once it has ended — the last part of the request
// path: the response trace line, the request metrics, the status page's "recent" row and the
// one log line (`outcome=... in=... out=... ttft_ms=... total_ms=...`).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gateway/protocol/response_builder.h"
#include "gateway/request/request_plan.h"
#include "gateway/status/request_board.h"

namespace pulse::gateway {

// How a request ended, as the metrics (pulse_requests_total{outcome}) and the log name it.
enum class Outcome { none, completed, incomplete, failed, unavailable, rejected, invalid, cancelled, client_lost };
const char* name(Outcome o);
Outcome outcome_of(ResponseBuilder::Ending e);

struct RequestRecord {
    std::string id, model_id;
    std::string served_by;  // the endpoint that accepted it last, "" if none did
    Outcome outcome = Outcome::none;
    std::chrono::steady_clock::time_point t0;
    std::optional<std::chrono::milliseconds> ttft;
    int resumes = 0;
    const ResponseBuilder* builder = nullptr;  // null when the request never got one
    const BudgetReport* budget = nullptr;      // null without a reasoning budget
};

// Writes the record: trace (when `trace_file` is set), metrics, the board's entry, the log line.
void record(const RequestRecord& r, RequestBoard& board, const std::shared_ptr<RequestBoard::Entry>& entry, const std::string& trace_file);

}  // namespace pulse::gateway
