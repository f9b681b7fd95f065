#include "server/http_server.h"

#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/ThreadPool.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "common/log.h"

namespace pulse::server {
namespace {

constexpr int kSpareWorkers = 16;

class RequestHandler : public Poco::Net::HTTPRequestHandler {
public:
    explicit RequestHandler(const Handler& h) : h_(h) {}
    void handleRequest(Poco::Net::HTTPServerRequest& req, Poco::Net::HTTPServerResponse& resp) override {
        try {
            h_(req, resp);
        } catch (const std::exception& e) {
            log::error("http", std::string("unhandled exception in request handler: ") + e.what());
        }
    }

private:
    const Handler& h_;
};

class Factory : public Poco::Net::HTTPRequestHandlerFactory {
public:
    explicit Factory(const Handler& h) : h_(h) {}
    Poco::Net::HTTPRequestHandler* createRequestHandler(const Poco::Net::HTTPServerRequest&) override {
        return new RequestHandler(h_);
    }

private:
    const Handler& h_;
};

}  // namespace

HttpServer::HttpServer(const config::Server& cfg, Handler handler) : cfg_(cfg), handler_(std::move(handler)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
    Poco::Net::ServerSocket socket;
    try {
        Poco::Net::SocketAddress addr(cfg_.listen.host, cfg_.listen.port);
        // SO_REUSEADDR for fast restarts, but never SO_REUSEPORT: a second gateway on the same
        // port must fail loudly, not silently share the traffic.
        socket.bind(addr, /*reuseAddress=*/true, /*reusePort=*/false);
        socket.listen(static_cast<int>(std::max<int64_t>(cfg_.queue, 64)));
    } catch (const Poco::Exception& e) {
        throw std::runtime_error("cannot listen on " + cfg_.listen.host + ":" + std::to_string(cfg_.listen.port) +
                                 ": " + e.displayText());
    }
    port_ = socket.address().port();
    // Spare workers beyond max_streams answer over-capacity requests with a 503 (the gateway
    // counts streams) instead of leaving them queued or silently closed.
    int threads = static_cast<int>(cfg_.max_streams) + kSpareWorkers;
    pool_ = std::make_unique<Poco::ThreadPool>(std::min(threads, 4), threads + 2, 60);
    auto* params = new Poco::Net::HTTPServerParams;
    params->setMaxThreads(threads);
    params->setMaxQueued(static_cast<int>(cfg_.queue));
    params->setKeepAlive(true);
    // An idle keep-alive connection holds a worker: close it soon. A client that sends its
    // request (or reads our answer) slower than send_timeout_s is cut off.
    params->setKeepAliveTimeout(Poco::Timespan(static_cast<long>(std::min(cfg_.send_timeout_s, 5.0) * 1e6)));
    params->setTimeout(Poco::Timespan(static_cast<long>(cfg_.send_timeout_s * 1e6)));
    server_ = std::make_unique<Poco::Net::HTTPServer>(new Factory(handler_), *pool_, socket, params);
    server_->start();
}

void HttpServer::stop_accepting() {
    if (server_) server_->stop();
}

void HttpServer::stop() {
    if (!server_) return;
    server_->stopAll(true);
    server_.reset();
    pool_->joinAll();
    pool_.reset();
}

uint16_t HttpServer::port() const { return port_; }

}  // namespace pulse::server
