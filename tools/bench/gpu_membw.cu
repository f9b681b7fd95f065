// GPU memory read bandwidth, the bound a decode step works against (tools/gpu-check): a kernel
// reads a buffer of N GiB (default 4) once per pass with 16-byte loads and keeps one sum per
// thread; the best of ten timed passes after two warm-ups. Prints GB/s (1e9 bytes).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

__global__ void read_all(const float4* p, size_t n, float* sink) {
    float s = 0;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const float4 v = p[i];
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 1.2345f) *sink = s;  // never true for the zeroed buffer; keeps the loads
}

int main(int argc, char** argv) {
    const double gib = argc > 1 ? std::atof(argv[1]) : 4;
    const size_t bytes = static_cast<size_t>(gib * (1 << 30)) / 16 * 16;
    float4* p = nullptr;
    float* sink = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMalloc(&sink, sizeof(float)) != cudaSuccess) {
        std::fprintf(stderr, "gpu-membw: cannot allocate %.1f GiB on the GPU\n", gib);
        return 1;
    }
    cudaMemset(p, 0, bytes);
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float best = 1e30f;
    for (int it = 0; it < 12; ++it) {
        cudaEventRecord(a);
        read_all<<<sms * 8, 512>>>(p, bytes / 16, sink);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (it >= 2 && ms < best) best = ms;
    }
    if (cudaGetLastError() != cudaSuccess) {
        std::fprintf(stderr, "gpu-membw: the kernel failed\n");
        return 1;
    }
    std::printf("%.1f\n", static_cast<double>(bytes) / (best * 1e-3) / 1e9);
    return 0;
}
