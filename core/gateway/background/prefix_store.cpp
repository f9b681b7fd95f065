#include "gateway/background/prefix_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/log.h"
#include "plugin/host_api.h"

namespace pulse::gateway {

namespace {

// {"path": ..., "root_path": ..., "body": BODY}, written with one copy of the body.
std::string sent_text(std::string_view path, bool root_path, std::string_view body) {
    rapidjson::StringBuffer p;
    rapidjson::Writer<rapidjson::StringBuffer> w(p);
    w.String(path.data(), static_cast<rapidjson::SizeType>(path.size()));
    std::string s;
    s.reserve(body.size() + p.GetSize() + 40);
    s.append(R"({"path":)").append(p.GetString(), p.GetSize()).append(root_path ? R"(,"root_path":true,"body":)" : R"(,"root_path":false,"body":)");
    s.append(body).append("}");
    return s;
}

}  // namespace

void PrefixStore::evict(Model& m) {
    while (!m.lru.empty() && (m.lru.size() > max_entries_ || m.bytes > max_bytes_)) {
        m.bytes -= m.lru.back().body.size();
        m.lru.pop_back();
    }
}

void PrefixStore::remember(const std::string& model, const std::string& key, const pulse_upstream_req& sent) {
    const std::string_view body = sent.body.text();
    // A body of over an eighth of the budget (a prompt full of images) would evict every
    // conversation for one replay: not kept (and not copied).
    if (max_entries_ == 0 || body.size() > max_bytes_ / 8) return;
    keep(model, key, sent_text(sent.path, sent.root_path, body));
}

void PrefixStore::keep(const std::string& model, const std::string& key, std::string body) {
    if (max_entries_ == 0 || body.size() > max_bytes_ / 8) return;
    std::lock_guard lock(m_);
    Model& m = models_[model];
    for (auto it = m.lru.begin(); it != m.lru.end(); ++it)
        if (it->key == key) {
            m.bytes -= it->body.size();
            m.lru.erase(it);
            break;
        }
    m.bytes += body.size();
    m.lru.push_front({key, std::move(body), std::chrono::steady_clock::now()});
    evict(m);
    dirty_ = true;
}

bool PrefixStore::served_since(const std::string& model, const std::string& key, std::chrono::steady_clock::time_point t) const {
    std::lock_guard lock(m_);
    if (auto it = models_.find(model); it != models_.end())
        for (const auto& e : it->second.lru)
            if (e.key == key) return e.at >= t;
    return false;
}

std::vector<std::pair<std::string, std::string>> PrefixStore::bodies(const std::string& model,
                                                                     const std::function<bool(const std::string&)>& wanted,
                                                                     std::chrono::steady_clock::time_point before) const {
    std::vector<std::pair<std::string, std::string>> entries;
    {
        std::lock_guard lock(m_);
        if (auto it = models_.find(model); it != models_.end())
            for (const auto& e : it->second.lru)
                if (e.at < before) entries.emplace_back(e.key, e.body);
    }
    if (wanted)  // unlocked: it may take other locks
        std::erase_if(entries, [&](const auto& e) { return !wanted(e.first); });
    return entries;
}

bool PrefixStore::dirty() const {
    std::lock_guard lock(m_);
    return dirty_;
}

void PrefixStore::save(const std::filesystem::path& file) {
    std::string text;
    {
        std::lock_guard lock(m_);
        rapidjson::StringBuffer b;
        rapidjson::Writer<rapidjson::StringBuffer> w(b);
        w.StartObject();
        w.Key("version");
        w.Int(2);
        w.Key("models");
        w.StartObject();
        for (const auto& [name, m] : models_) {
            w.Key(name.c_str());
            w.StartArray();
            for (auto it = m.lru.rbegin(); it != m.lru.rend(); ++it) {  // oldest first: load replays in order
                w.StartObject();
                w.Key("key");
                w.String(it->key.c_str());
                w.Key("request");
                w.String(it->body.c_str(), static_cast<rapidjson::SizeType>(it->body.size()));
                w.EndObject();
            }
            w.EndArray();
        }
        w.EndObject();
        w.EndObject();
        text.assign(b.GetString(), b.GetSize());
        dirty_ = false;
    }
    // It holds prompts: 0600 from the first byte, then an atomic rename.
    std::string tmp = file.string() + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        log::warn("warmup", "cannot write " + tmp + ": " + std::strerror(errno));
        return;
    }
    ::fchmod(fd, 0600);
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ok = ::fsync(fd) == 0 && ok;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), file.c_str()) != 0) log::warn("warmup", "cannot write " + file.string());
}

void PrefixStore::load(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return;
    std::string text((std::istreambuf_iterator<char>(in)), {});
    rapidjson::Document d;
    d.Parse(text.c_str(), text.size());
    if (!d.IsObject() || !d.HasMember("models") || !d["models"].IsObject()) {
        log::warn("warmup", "ignoring " + file.string() + ": not a warmup state file");
        return;
    }
    size_t n = 0;
    auto text_of = [](const rapidjson::Value& e, const char* k) {
        auto it = e.FindMember(k);
        return it != e.MemberEnd() && it->value.IsString() ? std::string(it->value.GetString(), it->value.GetStringLength()) : std::string();
    };
    for (const auto& m : d["models"].GetObject()) {
        if (!m.value.IsArray()) continue;
        for (const auto& e : m.value.GetArray()) {
            if (!e.IsObject() || text_of(e, "key").empty()) continue;
            std::string sent = text_of(e, "request");
            // Version 1 kept only bodies, and only of requests sent to the chat path.
            if (std::string body = text_of(e, "body"); sent.empty() && !body.empty()) sent = sent_text("/chat/completions", false, body);
            if (sent.empty()) continue;
            keep(m.name.GetString(), text_of(e, "key"), std::move(sent));
            ++n;
        }
    }
    std::lock_guard lock(m_);
    dirty_ = false;
    log::info("warmup", "loaded " + std::to_string(n) + " prompt prefixes from " + file.string());
}

}  // namespace pulse::gateway
