// The HTTP listener: POCO's HTTPServer with a bounded worker pool, bound to the configured
// address. It knows nothing about routes; every request goes to one Handler.
#pragma once

#include <functional>
#include <memory>

#include "config/config.h"

namespace Poco::Net {
class HTTPServerRequest;
class HTTPServerResponse;
class HTTPServer;
}  // namespace Poco::Net
namespace Poco {
class ThreadPool;
}

namespace pulse::server {

using Handler = std::function<void(Poco::Net::HTTPServerRequest&, Poco::Net::HTTPServerResponse&)>;

class HttpServer {
public:
    HttpServer(const config::Server& cfg, Handler handler);
    ~HttpServer();

    // Binds and starts accepting. Throws std::runtime_error with the OS reason on failure.
    void start();
    // Closes the listening socket; requests in flight continue.
    void stop_accepting();
    // Closes every connection and joins the workers.
    void stop();
    uint16_t port() const;  // the bound port (useful with port 0 in tests)

private:
    config::Server cfg_;
    Handler handler_;
    std::unique_ptr<Poco::ThreadPool> pool_;
    std::unique_ptr<Poco::Net::HTTPServer> server_;
    uint16_t port_ = 0;
};

}  // namespace pulse::server
