#include "gateway/protocol/sse.h"

namespace pulse::gateway {

std::string sse_event(std::string_view type, std::string_view json) {
    std::string out;
    out.reserve(type.size() + json.size() + 16);
    out += "event: ";
    out += type;
    out += "\ndata: ";
    out += json;
    out += "\n\n";
    return out;
}

}  // namespace pulse::gateway
