// What one request may use of the gateway, as an interface: the request path (this folder)
// depends on it, never on the Gateway class that implements it (gateway.h), so a request's code
// sees the services it is given and nothing else of the router.
#pragma once

#include <memory>
#include <string>

namespace pulse {
class Wakeup;
}

namespace pulse::gateway {

struct Snapshot;
struct EndpointRef;
class RequestBoard;
class PrefixStore;
class Warmer;
class Liveness;
class StreamLoop;

// Its configuration snapshot, the shared services, and the two calls that report what a request
// learned about an endpoint.
class RequestContext {
public:
    virtual std::shared_ptr<const Snapshot> snapshot() const = 0;
    // The drain deadline passed: responses in flight end now.
    virtual bool cutting() const = 0;
    // Signalled, and left signalled, when the cut comes: what a sleeping request thread waits on.
    virtual const Wakeup& cut_signal() const = 0;
    virtual RequestBoard& board() = 0;
    virtual PrefixStore& prefixes() = 0;
    virtual Warmer* warmer() = 0;  // null when warmup is off
    virtual Liveness* liveness() = 0;
    virtual StreamLoop& relay() = 0;
    virtual void endpoint_ok(const std::string& model, const EndpointRef& ep, bool real_request) = 0;
    virtual void endpoint_failed(const EndpointRef& ep, const std::string& why, bool real_request) = 0;

protected:
    ~RequestContext() = default;
};

}  // namespace pulse::gateway
