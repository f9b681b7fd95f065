// A decoder device for tests: every op forwarded to the CPU device it owns, its own Buffers in
// front of the CPU device's (kept until released). Tests derive from it and override what they
// count or make fail.
#pragma once

#include <memory>
#include <vector>

#include "device/device.h"

namespace pulse::test {

class ForwardingDevice : public decoder::Device {
public:
    ForwardingDevice() : cpu_(decoder::make_device("cpu")) {}
    decoder::Buffer alloc(size_t n) const override {
        decoder::Buffer inner = cpu_->alloc(n);
        decoder::DevPtr p = inner.ptr();
        held_.push_back(std::move(inner));
        return decoder::Buffer(this, p, n);
    }
    void release(decoder::DevPtr p) const override {
        std::erase_if(held_, [&](const decoder::Buffer& b) { return same(b.ptr(), p); });
    }
    bool holds(decoder::DevPtr p) const {
        for (const auto& b : held_)
            if (same(b.ptr(), p)) return true;
        return false;
    }
    void upload(const float* h, decoder::DevPtr to, size_t n) const override { cpu_->upload(h, to, n); }
    void download(decoder::DevPtr from, float* h, size_t n) const override { cpu_->download(from, h, n); }
    void copy(decoder::DevPtr from, decoder::DevPtr to, size_t n) const override { cpu_->copy(from, to, n); }
    const void* prepare(const decoder::Matrix& w, Use use) override { return cpu_->prepare(w, use); }
    void embed(const decoder::Matrix& t, const int32_t* tok, int64_t B, decoder::DevPtr out) const override { cpu_->embed(t, tok, B, out); }
    void matmul(const decoder::Matrix& w, decoder::DevPtr x, int64_t B, decoder::DevPtr y, bool i8) const override { cpu_->matmul(w, x, B, y, i8); }
    void rmsnorm(decoder::DevPtr x, decoder::DevPtr w, decoder::DevPtr o, int64_t r, int64_t n, double e) const override { cpu_->rmsnorm(x, w, o, r, n, e); }
    void swiglu(decoder::DevPtr g, decoder::DevPtr u, int64_t n) const override { cpu_->swiglu(g, u, n); }
    void add(decoder::DevPtr x, decoder::DevPtr y, int64_t n) const override { cpu_->add(x, y, n); }
    void rotate(const decoder::Rotation& r, decoder::DevPtr x, decoder::DevPtr o, int64_t B) const override { cpu_->rotate(r, x, o, B); }
    void attention(const decoder::AttentionOp* ops, size_t n) const override { cpu_->attention(ops, n); }
    void deltanet(const decoder::DeltaNetOp* ops, size_t n) const override { cpu_->deltanet(ops, n); }

private:
    static bool same(decoder::DevPtr a, decoder::DevPtr b) { return decoder::DeviceMemory::raw(a) == decoder::DeviceMemory::raw(b); }
    std::unique_ptr<decoder::Device> cpu_;
    mutable std::vector<decoder::Buffer> held_;  // the CPU device's buffers behind ours
};

}  // namespace pulse::test
