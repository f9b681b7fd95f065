#include "http/client.h"

#include <Poco/Exception.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/String.h>
#include <Poco/URI.h>

namespace pulse::http {

namespace {

Poco::Timespan span(double s) { return Poco::Timespan(static_cast<Poco::Timespan::TimeDiff>(s * 1e6)); }

std::string find(const Fields& fields, std::string_view name) {
    for (const auto& [k, v] : fields)
        if (Poco::icompare(k, std::string(name)) == 0) return v;
    return {};
}

// Sends `req` and reads the answer's head; the body is left in the returned stream.
std::istream& exchange(Poco::Net::HTTPClientSession& s, const Request& req, Poco::Net::HTTPResponse& resp) {
    Poco::Net::HTTPRequest r(req.method, req.target.empty() ? "/" : req.target, Poco::Net::HTTPMessage::HTTP_1_1);
    for (const auto& [k, v] : req.fields) r.set(k, v);
    if (req.method == "GET" || req.method == "HEAD") {
        s.sendRequest(r);
    } else {
        r.setContentType(req.content_type);
        r.setContentLength(static_cast<std::streamsize>(req.body.size()));
        std::ostream& os = s.sendRequest(r);
        os.write(req.body.data(), static_cast<std::streamsize>(req.body.size()));
        os.flush();
        if (!os.good()) throw Poco::IOException("sending the request failed");
    }
    return s.receiveResponse(resp);
}

Fields fields_of(const Poco::Net::HTTPResponse& resp) {
    Fields f;
    for (const auto& [k, v] : resp) f.emplace_back(k, v);
    return f;
}

}  // namespace

std::string Answer::field(std::string_view name) const { return find(fields, name); }
std::string Stream::field(std::string_view name) const { return find(fields_, name); }
Stream::~Stream() = default;

std::unique_ptr<Poco::Net::HTTPClientSession> session(const Poco::URI& origin, const Timeouts& t) {
    auto s = std::make_unique<Poco::Net::HTTPClientSession>(origin.getHost(), origin.getPort());
    s->setTimeout(span(t.connect_s), span(t.send_s), span(t.receive_s));
    return s;
}

std::string under(const std::string& origin, std::string_view path) {
    std::string base = Poco::URI(origin).getPath();
    while (!base.empty() && base.back() == '/') base.pop_back();
    return base + std::string(path);
}

Answer fetch(const std::string& origin, const Request& req, const Timeouts& t, size_t max_body) {
    Answer a;
    try {
        auto s = session(Poco::URI(origin), t);
        Poco::Net::HTTPResponse resp;
        std::istream& in = exchange(*s, req, resp);
        a.status = static_cast<int>(resp.getStatus());
        a.fields = fields_of(resp);
        char buf[16384];
        while (a.body.size() < max_body && in.read(buf, sizeof buf).gcount() > 0) a.body.append(buf, static_cast<size_t>(in.gcount()));
        if (a.body.size() > max_body) a.body.resize(max_body);
    } catch (const Poco::TimeoutException& e) {
        a = {};
        a.timed_out = true;
        a.error = e.displayText();
    } catch (const Poco::Exception& e) {
        a = {};
        a.error = e.displayText();
    } catch (const std::exception& e) {
        a = {};
        a.error = e.what();
    }
    return a;
}

std::unique_ptr<Stream> open(const std::string& origin, const Request& req, const Timeouts& t, std::string* error) {
    try {
        std::unique_ptr<Stream> st(new Stream());
        st->session_ = session(Poco::URI(origin), t);
        Poco::Net::HTTPResponse resp;
        st->body_ = &exchange(*st->session_, req, resp);
        st->status_ = static_cast<int>(resp.getStatus());
        st->fields_ = fields_of(resp);
        return st;
    } catch (const Poco::Exception& e) {
        if (error) *error = e.displayText();
    } catch (const std::exception& e) {
        if (error) *error = e.what();
    }
    return nullptr;
}

}  // namespace pulse::http
