// What a failed attempt can still save of its response (decisions and their bookkeeping; the
// attempt driver does the sending): a request the backend refused for its reasoning budget is
// sent again without it, and a response whose backend failed after its output began continues
// on the next endpoint (mid-stream resume).
#pragma once

#include <string>

#include "gateway/request/response_state.h"

namespace pulse::gateway {

// A backend refused the request because of its reasoning budget field (vLLM without a
// reasoning config, or a model runner without budgets, answers 400 naming the field). True
// when the request was rebuilt without the budget (reported as not enforced): a policy never
// costs the request.
bool drop_refused_budget(ResponseState& st, const EndpointRef& ep, const std::string& body);

// Endpoint `ep` failed (`why`) after the response's output began. next_endpoint: the model
// allows resume and the profile built the continuation, from exactly what the client has;
// ended: the answer already had every token the client allowed, so it ended incomplete here, as
// an uninterrupted one would have; impossible: the caller ends the response as failed, as it
// would have without resume.
enum class Resume { impossible, ended, next_endpoint };
Resume resume_elsewhere(ResponseState& st, const EndpointRef& ep, const std::string& why);

}  // namespace pulse::gateway
