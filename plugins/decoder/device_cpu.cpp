#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "device.h"
#include "kernels.h"
#include "quants.h"

namespace pulse::decoder {

namespace {

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
float silu(float x) { return x * sigmoid(x); }
float softplus(float x) { return x > 20 ? x : std::log1p(std::exp(x)); }

void rmsnorm_row(const float* x, const float* w, float* out, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

void l2norm(float* x, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    float r = static_cast<float>(1.0 / std::sqrt(ss + eps));
    for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

// Per-thread buffer for one decoded weight row: matmuls run per token, so no allocation there.
std::vector<float>& row_scratch(int64_t n) {
    thread_local std::vector<float> buf;
    if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
    return buf;
}

void matvec(const Matrix& w, const float* x, float* y) {
    const TensorInfo& t = *w.t;
    const uint64_t rb = t.row_bytes();
#pragma omp parallel
    {
        std::vector<float>& scratch = row_scratch(w.n_in);
#pragma omp for schedule(static)
        for (int64_t o = 0; o < w.n_out; ++o)
            y[o] = dot_row(t.type, t.data + static_cast<uint64_t>(o) * rb, x, w.n_in, scratch.data()) * w.scale;
    }
}

void matmat(const Matrix& w, const float* x, int64_t B, float* y, bool int8) {
    if (B == 1) return matvec(w, x, y);
    const TensorInfo& t = *w.t;
    const uint64_t rb = t.row_bytes();
    const int64_t n = w.n_in;
    // int8 activations: quantize every row of X once, then 8-bit dots four tokens at a time.
    const bool i8 = int8 && B >= 4 && n % 32 == 0 && has_i8_kernel(t.type);
    std::vector<int8_t> xq;
    std::vector<float> xd;
    if (i8) {
        xq.resize(static_cast<size_t>(B * n));
        xd.resize(static_cast<size_t>(B * (n / 32)));
        for (int64_t b = 0; b < B; ++b) quantize_act_q8(x + b * n, n, xq.data() + b * n, xd.data() + b * (n / 32));
    }
#pragma omp parallel
    {
        std::vector<float>& scratch = row_scratch(n);
#pragma omp for schedule(static)
        for (int64_t o = 0; o < w.n_out; ++o) {
            const uint8_t* raw = t.data + static_cast<uint64_t>(o) * rb;
            int64_t b = 0;
            if (i8) {
                for (; b + 4 <= B; b += 4) {
                    float d[4];
                    dot4_row_i8(t.type, raw, xq.data() + b * n, xd.data() + b * (n / 32), n, d);
                    for (int k = 0; k < 4; ++k) y[(b + k) * w.n_out + o] = d[k] * w.scale;
                }
                for (; b < B; ++b) y[b * w.n_out + o] = dot_row(t.type, raw, x + b * n, n, scratch.data()) * w.scale;
                continue;
            }
            // Decode the row once, then one dot per token (four at a time).
            const float* r = reinterpret_cast<const float*>(raw);
            if (t.type != kF32) {
                dequantize_row(t.type, raw, scratch.data(), n);
                r = scratch.data();
            }
            for (; b + 4 <= B; b += 4) {
                float d[4];
                dot4_f32(r, x + b * n, n, d);
                for (int k = 0; k < 4; ++k) y[(b + k) * w.n_out + o] = d[k] * w.scale;
            }
            for (; b < B; ++b) y[b * w.n_out + o] = dot_f32(r, x + b * n, n) * w.scale;
        }
    }
}


class CpuDevice : public Device {
public:
    const char* name() const override { return "cpu"; }
    void matmul(const Matrix& w, const float* x, int64_t B, float* y, bool int8) const override { matmat(w, x, B, y, int8); }
    void rmsnorm(const float* x, const float* w, float* out, int64_t rows, int64_t n, double eps) const override {
        for (int64_t r = 0; r < rows; ++r) rmsnorm_row(x + r * n, w, out + r * n, n, eps);
    }
    void swiglu(float* g, const float* u, int64_t n) const override {
        for (int64_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
    }
    void add(float* x, const float* y, int64_t n) const override {
        for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    }
    void rotate(const Rotation& r, const float* x, float* out, int64_t B) const override {
#pragma omp parallel for schedule(static) if (B > 1)
        for (int64_t b = 0; b < B; ++b) rotate_row(r, x + b * r.width, out + b * r.width);
    }
    void attention(const AttentionOp& op) const override;
    void deltanet(const DeltaNetOp& op) const override;
};

void CpuDevice::attention(const AttentionOp& op) const {
    const int64_t B = op.B, H = op.H, Hkv = op.Hkv, D = op.D, R = op.R;
    std::fill(op.out, op.out + B * H * D, 0.f);
    for (int64_t b = 0; b < B; ++b) {
        const float* qg = op.qg + b * 2 * H * D;
        std::vector<float> kn(op.k + b * Hkv * D, op.k + (b + 1) * Hkv * D);
        std::vector<float> vx(op.v + b * Hkv * D, op.v + (b + 1) * Hkv * D);
        const int64_t p = op.pos0 + b;
        // NeoX partial RoPE: pairs (i, i + R/2) of the first R dims; frequency exponent over R.
        auto rope = [&](float* v) {
            for (int64_t i = 0; i < R / 2; ++i) {
                double theta = static_cast<double>(p) * std::pow(op.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(R));
                float c = static_cast<float>(std::cos(theta)), sn = static_cast<float>(std::sin(theta));
                float a = v[i], bb = v[i + R / 2];
                v[i] = a * c - bb * sn;
                v[i + R / 2] = a * sn + bb * c;
            }
        };
        std::vector<float> q(static_cast<size_t>(H * D)), gate(static_cast<size_t>(H * D));
        for (int64_t j = 0; j < H; ++j) {
            rmsnorm_row(qg + 2 * D * j, op.q_norm, q.data() + D * j, D, op.eps);
            std::memcpy(gate.data() + D * j, qg + 2 * D * j + D, static_cast<size_t>(D) * 4);
            rope(q.data() + D * j);
        }
        for (int64_t j = 0; j < Hkv; ++j) {
            std::vector<float> raw(kn.begin() + D * j, kn.begin() + D * (j + 1));
            rmsnorm_row(raw.data(), op.k_norm, kn.data() + D * j, D, op.eps);
            rope(kn.data() + D * j);
        }
        // The cache holds K and V at f16 precision, as llama.cpp's default F16 cache does.
        for (auto& xv : kn) xv = fp16_to_f32(f32_to_fp16(xv));
        for (auto& xv : vx) xv = fp16_to_f32(f32_to_fp16(xv));
        auto& kc = *op.k_cache;
        auto& vc = *op.v_cache;
        kc.insert(kc.end(), kn.begin(), kn.end());
        vc.insert(vc.end(), vx.begin(), vx.end());
        const int64_t n = static_cast<int64_t>(kc.size()) / (Hkv * D);
        const float scale = static_cast<float>(op.scale);
        float* o = op.out + b * H * D;
        const int64_t group = H / Hkv;
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < H; ++j) {
            const int64_t kvh = j / group;  // GQA: blocks of consecutive query heads share a KV head
            std::vector<float> w(static_cast<size_t>(n));
            float mx = -INFINITY;
            for (int64_t t = 0; t < n; ++t) {
                w[static_cast<size_t>(t)] = dot_f32(q.data() + j * D, kc.data() + (t * Hkv + kvh) * D, D) * scale;
                mx = std::max(mx, w[static_cast<size_t>(t)]);
            }
            double sum = 0;
            for (auto& xw : w) sum += (xw = std::exp(xw - mx));
            float* oj = o + j * D;
            for (int64_t t = 0; t < n; ++t) {
                const float* vt = vc.data() + (t * Hkv + kvh) * D;
                float a = static_cast<float>(w[static_cast<size_t>(t)] / sum);
                for (int64_t d = 0; d < D; ++d) oj[d] += a * vt[d];
            }
            for (int64_t d = 0; d < D; ++d) oj[d] *= sigmoid(gate[static_cast<size_t>(j * D + d)]);
        }
    }
}

void CpuDevice::deltanet(const DeltaNetOp& op) const {
    const int64_t B = op.B, K = op.K, C = op.C, S = op.S, Hk = op.Hk, Hv = op.Hv;
    const int64_t kd = Hk * S, VD = Hv * S;
    float* win = op.conv_state;
    float* st = op.state;
    const float inv_sqrt_s = 1.f / std::sqrt(static_cast<float>(S));
    for (int64_t b = 0; b < B; ++b) {
        const float* qkv = op.qkv + b * C;
        const float* z = op.z + b * VD;
        const float* beta = op.beta + b * Hv;
        const float* alpha = op.alpha + b * Hv;
        // Causal depthwise conv over the last K inputs (window of K-1 previous + current), then SiLU.
        std::vector<float> y(static_cast<size_t>(C));
        for (int64_t c = 0; c < C; ++c) {
            float acc = 0;
            for (int64_t t = 0; t < K - 1; ++t) acc += op.conv[c * K + t] * win[t * C + c];
            acc += op.conv[c * K + K - 1] * qkv[c];
            y[static_cast<size_t>(c)] = silu(acc);
        }
        if (K > 1) {
            std::memmove(win, win + C, static_cast<size_t>((K - 2) * C) * 4);
            std::memcpy(win + (K - 2) * C, qkv, static_cast<size_t>(C) * 4);
        }
        float* q = y.data();
        float* kk = y.data() + kd;
        float* v = y.data() + 2 * kd;
        for (int64_t m = 0; m < Hk; ++m) {
            l2norm(q + m * S, S, op.eps);
            l2norm(kk + m * S, S, op.eps);
        }
        float* o = op.out + b * VD;
#pragma omp parallel for schedule(static)
        for (int64_t hh = 0; hh < Hv; ++hh) {
            const int64_t m = hh % Hk;  // tiled key head for this value head
            const float bt = sigmoid(beta[hh]);
            const float decay = std::exp(softplus(alpha[hh] + op.dt_bias[hh]) * op.ssm_a[hh]);
            float* Sm = st + hh * S * S;  // Sm[i * S + j]: i = key dim, j = value dim
            const float* km = kk + m * S;
            const float* qm = q + m * S;
            const float* vh = v + hh * S;
            std::vector<float> delta(static_cast<size_t>(S), 0.f), acc(static_cast<size_t>(S), 0.f);
            // S <- decay*S; delta = beta*(v - S^T k); S += k delta^T; o = S^T q / sqrt(S)
            for (int64_t i = 0; i < S; ++i) {
                float* row = Sm + i * S;
                const float ki = km[i];
                for (int64_t j = 0; j < S; ++j) {
                    row[j] *= decay;
                    acc[static_cast<size_t>(j)] += row[j] * ki;
                }
            }
            for (int64_t j = 0; j < S; ++j) delta[static_cast<size_t>(j)] = bt * (vh[j] - acc[static_cast<size_t>(j)]);
            std::fill(acc.begin(), acc.end(), 0.f);
            for (int64_t i = 0; i < S; ++i) {
                float* row = Sm + i * S;
                const float ki = km[i], qi = qm[i];
                for (int64_t j = 0; j < S; ++j) {
                    row[j] += ki * delta[static_cast<size_t>(j)];
                    acc[static_cast<size_t>(j)] += row[j] * qi;
                }
            }
            float* oh = o + hh * S;
            for (int64_t j = 0; j < S; ++j) oh[j] = acc[static_cast<size_t>(j)] * inv_sqrt_s;
            std::vector<float> normed(static_cast<size_t>(S));
            rmsnorm_row(oh, op.ssm_norm, normed.data(), S, op.eps);
            for (int64_t j = 0; j < S; ++j) oh[j] = normed[static_cast<size_t>(j)] * silu(z[hh * S + j]);
        }
    }
}

}  // namespace

std::unique_ptr<Device> make_device(const std::string& name) {
    if (name.empty() || name == "cpu") return std::make_unique<CpuDevice>();
    throw std::invalid_argument("device '" + name + "' is not available in this build (devices: cpu; CUDA is a later part)");
}

}  // namespace pulse::decoder
