#include "device.h"

#include <stdexcept>

namespace pulse::decoder {

std::unique_ptr<Device> make_cpu_device();  // device_cpu.cpp

Buffer& Buffer::operator=(Buffer&& o) noexcept {
    if (this != &o) {
        if (dev_ && p_) dev_->release(p_);
        dev_ = o.dev_, p_ = o.p_, n_ = o.n_;
        o.dev_ = nullptr, o.p_ = DevPtr(), o.n_ = 0;
    }
    return *this;
}

Buffer::~Buffer() {
    if (dev_ && p_) dev_->release(p_);
}

Buffer Device::upload(const std::vector<float>& host) const {
    Buffer b = alloc(host.size());
    if (!host.empty()) upload(host.data(), b.ptr(), host.size());
    return b;
}

std::vector<std::string> device_names() { return {"cpu"}; }

std::unique_ptr<Device> make_device(const std::string& name) {
    if (name.empty() || name == "cpu") return make_cpu_device();
    std::string have;
    for (const auto& n : device_names()) have += (have.empty() ? "" : ", ") + n;
    throw std::invalid_argument("decoder device '" + name + "' is not in this build (it has: " + have + ")");
}

}  // namespace pulse::decoder
