#include "device/device.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace pulse::decoder {

std::unique_ptr<Device> make_cpu_device();  // device_cpu.cpp

Buffer Device::upload(const std::vector<float>& host) const {
    Buffer b = alloc(host.size());
    if (!host.empty()) upload(host.data(), b.ptr(), host.size());
    return b;
}

namespace {

#ifdef PULSE_HAVE_CUDA_DEVICE
// The CUDA device lives in pulse-device-cuda.so (cuda/device_cuda.cu), which links the CUDA
// runtime and cuBLAS; the decoder never links them itself. Before loading it, a probe asks the
// NVIDIA driver (libcuda.so.1, dlopen'd, never linked) whether there is a GPU at all, so a
// machine without one needs no CUDA library and pays one failed dlopen.
struct CudaLoad {
    using Create = Device* (*)(int, char*, size_t);
    Create create = nullptr;
    std::string why;  // when create is null
};

const CudaLoad& load_cuda() {
    static CudaLoad load;
    static std::once_flag once;
    std::call_once(once, [] {
        void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);  // kept loaded: the runtime uses it
        if (!driver) {
            load.why = "no NVIDIA driver: libcuda.so.1 is not installed";
            return;
        }
        using Init = int (*)(unsigned);
        using Count = int (*)(int*);
        auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
        auto count = reinterpret_cast<Count>(dlsym(driver, "cuDeviceGetCount"));
        int n = 0;
        if (!init || !count) {
            load.why = "libcuda.so.1 has no cuInit/cuDeviceGetCount";
            return;
        }
        if (int r = init(0); r != 0) {
            load.why = r == 100 ? "no NVIDIA GPU: the driver reports none" : "the NVIDIA driver did not initialise: cuInit error " + std::to_string(r);
            return;
        }
        if (count(&n) != 0 || n == 0) {
            load.why = "no NVIDIA GPU: the driver reports none";
            return;
        }
        // By name: the decoder's own RUNPATH points at the directory this build (or the
        // installation) keeps it in; PULSE_CUDA_DEVICE names another file.
        const char* env = std::getenv("PULSE_CUDA_DEVICE");
        const char* lib = env && *env ? env : "pulse-device-cuda.so";
        void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char* e = dlerror();
            load.why = std::string("cannot load the CUDA device: ") + (e ? e : lib);
            return;
        }
        load.create = reinterpret_cast<CudaLoad::Create>(dlsym(h, "pulse_cuda_device_create"));
        if (!load.create) load.why = std::string(lib) + " has no pulse_cuda_device_create";
    });
    return load;
}

// The CUDA device, or null with `why` set.
std::unique_ptr<Device> try_cuda(std::string& why) {
    const CudaLoad& l = load_cuda();
    if (!l.create) {
        why = l.why;
        return nullptr;
    }
    char note[512] = {};
    Device* d = l.create(kDeviceInterfaceVersion, note, sizeof note);
    why = note;
    return std::unique_ptr<Device>(d);
}
#endif

}  // namespace

std::vector<std::string> device_names() {
#ifdef PULSE_HAVE_CUDA_DEVICE
    return {"cpu", "cuda"};
#else
    return {"cpu"};
#endif
}

std::unique_ptr<Device> make_device(const std::string& name, std::string* note) {
    auto say = [&](const std::string& s) {
        if (note) *note = s;
    };
    if (name == "cpu") {
        say("device cpu (as configured)");
        return make_cpu_device();
    }
#ifdef PULSE_HAVE_CUDA_DEVICE
    if (name.empty() || name == "cuda") {
        std::string why;
        if (auto d = try_cuda(why)) {
            say("device cuda (" + why + ")");
            return d;
        }
        if (name == "cuda") throw DeviceUnavailable("decoder device 'cuda' is unavailable here: " + why);
        say("device cpu (" + why + ")");
        return make_cpu_device();
    }
#else
    if (name.empty()) {
        say("device cpu (this build has no CUDA device)");
        return make_cpu_device();
    }
#endif
    std::string have;
    for (const auto& n : device_names()) have += (have.empty() ? "" : ", ") + n;
    throw std::invalid_argument("decoder device '" + name + "' is not in this build (it has: " + have + ")");
}

}  // namespace pulse::decoder
