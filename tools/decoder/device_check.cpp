// device-check: every operation of the decoder's device interface (device.h) on every kernel
// level of this CPU and on the CUDA device where a GPU answers, over random shapes and values,
// against a double-precision reference written here from the ops' definitions, not from any
// device's code. One table, op × device/level: the largest absolute and relative error and
// whether it is within the op's tolerance. What ggml's test-backend-ops is to its backends: the
// first thing to run on a new machine (tools/gpu-check runs it before anything else), so that
// a wrong op is found by name, not as "the logits differ".
//
//   pulse-device-check [--devices cpu,cuda] [--levels all|LEVEL,...] [--require cuda] [--quick] [--verbose]
//
// Exit 0: every op of every device/level passed; 1: a failure (named in the table, and each
// failing case below it); 2: usage. A device this build lacks or this machine cannot run is a
// row of the devices list saying why, and a failure only when --require names it. An op a
// device does not implement is a failure too: the table has no blank cells.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "args/args.h"
#include "device/cpu/kernels.h"
#include "device/device.h"
#include "format/blocks.h"
#include "format/gguf.h"
#include "format/hadamard.h"
#include "format/quants.h"

using namespace pulse::decoder;

namespace {

// The worst error of an op's cases on one device/level.
struct Score {
    double abs = 0, rel = 0;
    bool ok = true, ran = false;
    std::string note;  // why it failed (the worst case, or the exception)
};

// Errors of `got` against `want`, element by element relative to `scale` (the magnitude the
// op's arithmetic works at: for a dot product Σ|w·x|, so a sum that cancels to near zero is not
// held to a relative bound it cannot meet).
Score compare(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale, double tol) {
    Score s;
    s.ran = true;
    if (got.size() != want.size()) {
        s.ok = false;
        s.note = "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
        return s;
    }
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) {
            s.ok = false;
            s.abs = s.rel = INFINITY;
            s.note = "element " + std::to_string(i) + " is " + std::to_string(got[i]);
            return s;
        }
        const double e = std::fabs(got[i] - want[i]), r = e / scale[i];
        s.abs = std::max(s.abs, e);
        if (r > s.rel) {
            s.rel = r;
            if (r > tol) s.note = "element " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
        }
    }
    s.ok = s.rel <= tol;
    return s;
}

void merge(Score& into, const Score& s) {
    into.ran = true;
    into.abs = std::max(into.abs, s.abs);
    if (s.rel >= into.rel || (!s.ok && into.ok)) into.rel = std::max(into.rel, s.rel);
    if (!s.ok && into.ok) into.note = s.note;
    into.ok = into.ok && s.ok;
}

std::vector<double> magnitudes(const std::vector<double>& v, double floor) {
    std::vector<double> m(v.size());
    for (size_t i = 0; i < v.size(); ++i) m[i] = std::fabs(v[i]) + floor;
    return m;
}

std::vector<float> download(const Device& dev, const Buffer& b) {
    std::vector<float> v(b.size());
    if (!v.empty()) dev.download(b.ptr(), v.data(), v.size());
    return v;
}

std::vector<float> normal(std::mt19937& g, size_t n, float mean = 0, float sd = 1) {
    std::normal_distribution<float> nd(mean, sd);
    std::vector<float> v(n);
    for (float& e : v) e = nd(g);
    return v;
}

// A weight of `type` with n_out rows of n_in values, made from random values (ternary types
// from ternary ones), and its decoded values (the reference decoder: quants.cpp's rows).
struct Weight {
    std::vector<uint8_t> bytes;
    TensorInfo t;
    std::vector<float> values;  // decoded, n_out × n_in
    Matrix m;
};

std::unique_ptr<Weight> make_weight(uint32_t type, int64_t n_in, int64_t n_out, float scale, std::mt19937& g) {
    auto w = std::make_unique<Weight>();
    std::vector<float> f = normal(g, static_cast<size_t>(n_in * n_out), 0, 0.5f);
    const bool ternary = type == kTQ1_0 || type == kTQ2_0 || type == kPTQ1_0;
    if (ternary)
        for (float& v : f) v = v > 0.25f ? 0.7f : v < -0.25f ? -0.7f : 0.f;
    if (type == kF32) {
        w->bytes.resize(f.size() * 4);
        std::memcpy(w->bytes.data(), f.data(), w->bytes.size());
    } else {
        w->bytes = quantize(type, f.data(), static_cast<int64_t>(f.size()));
    }
    w->t.name = "w";
    w->t.ne = {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)};
    w->t.type = type;
    w->t.nbytes = w->bytes.size();
    w->t.data = w->bytes.data();
    w->values.resize(f.size());
    dequantize_row(type, w->bytes.data(), w->values.data(), static_cast<int64_t>(f.size()));
    w->m = Matrix{&w->t, n_in, n_out, scale, nullptr, nullptr};
    return w;
}

// y = scale · W·x per token, and Σ|w·x| as each element's magnitude.
void matmul_reference(const Weight& w, const std::vector<float>& x, int64_t B, std::vector<double>& y, std::vector<double>& mag) {
    const int64_t n = w.m.n_in, o = w.m.n_out;
    y.assign(static_cast<size_t>(B * o), 0);
    mag.assign(y.size(), 0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t r = 0; r < o; ++r) {
            double s = 0, a = 0;
            for (int64_t i = 0; i < n; ++i) {
                const double p = static_cast<double>(w.values[static_cast<size_t>(r * n + i)]) * x[static_cast<size_t>(b * n + i)];
                s += p;
                a += std::fabs(p);
            }
            y[static_cast<size_t>(b * o + r)] = s * w.m.scale;
            mag[static_cast<size_t>(b * o + r)] = (a + 1e-6) * std::fabs(w.m.scale);
        }
}

constexpr uint32_t kWeightTypes[] = {kF32, kF16, kBF16, kQ8_0, kTQ2_0, kTQ1_0, kQ2_0, kPQ2_0, kQ2_0_G128, kQ1_0, kPTQ1_0, kQ4_K, kQ6_K};

// The results: op -> target -> score, in the order the ops first ran.
struct Table {
    std::vector<std::string> ops, targets;
    std::map<std::string, std::map<std::string, Score>> cells;
    std::vector<std::string> failures;
    bool verbose = false;
    void add(const std::string& op, const std::string& target, const std::string& what, const Score& s) {
        if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
        merge(cells[op][target], s);
        if (!s.ok) failures.push_back(target + " " + op + " [" + what + "]: " + s.note);
        if (verbose) std::printf("  %-10s %-28s %-34s abs %.3g rel %.3g %s\n", target.c_str(), op.c_str(), what.c_str(), s.abs, s.rel, s.ok ? "ok" : "FAIL");
    }
};

// Runs `f` as one case; an exception (an op the device refuses or lacks) is that case's failure.
void run_case(Table& t, const std::string& op, const std::string& target, const std::string& what, const std::function<Score()>& f) {
    Score s;
    try {
        s = f();
    } catch (const std::exception& e) {
        s.ran = true;
        s.ok = false;
        s.abs = s.rel = INFINITY;
        s.note = std::string("threw: ") + e.what();
    }
    t.add(op, target, what, s);
}

void check_embed(Table& t, Device& dev, const std::string& target, std::mt19937& g) {
    for (uint32_t type : kWeightTypes) {
        const int64_t n = 256;
        run_case(t, std::string("embed ") + type_name(type), target, "rows 5", [&] {
            auto w = make_weight(type, n, 12, 1.f, g);
            const void* prepared = dev.prepare(w->m, Device::Use::embedding);
            w->m.prepared = prepared;
            const int32_t tokens[5] = {3, 0, 11, 3, 7};
            Buffer out = dev.alloc(static_cast<size_t>(5 * n));
            dev.embed(w->m, tokens, 5, out.ptr());
            std::vector<double> want(static_cast<size_t>(5 * n));
            for (int b = 0; b < 5; ++b)
                for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(b * n + i)] = w->values[static_cast<size_t>(tokens[b] * n + i)];
            return compare(download(dev, out), want, magnitudes(want, 1e-30), 1e-7);
        });
    }
}

void check_matmul(Table& t, Device& dev, const std::string& target, std::mt19937& g, bool quick) {
    // 43 rows: five groups of eight (an odd last one where a device packs them in pairs) and
    // three rows past them; 512 inputs: two TQ2_0 blocks, four of 128, sixteen of 32.
    const int64_t n_in = 512, n_out = 43;
    const std::vector<int64_t> batches = quick ? std::vector<int64_t>{1, 2, 5, 16} : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 16, 64};
    for (uint32_t type : kWeightTypes) {
        auto w = make_weight(type, n_in, n_out, 0.75f, g);
        w->m.prepared = dev.prepare(w->m, Device::Use::matmul);
        for (bool int8 : {true, false}) {
            const std::string op = std::string("matmul ") + type_name(type) + (int8 ? " int8" : " exact");
            for (int64_t B : batches) {
                run_case(t, op, target, "tokens " + std::to_string(B), [&] {
                    const std::vector<float> x = normal(g, static_cast<size_t>(B * n_in));
                    Buffer xd = dev.upload(x), y = dev.alloc(static_cast<size_t>(B * n_out));
                    dev.matmul(w->m, xd.ptr(), B, y.ptr(), int8);
                    std::vector<double> want, mag;
                    matmul_reference(*w, x, B, want, mag);
                    // int8 activations (or f16 ones) round each input to ~1/254 of its block's
                    // largest: within 1 % of Σ|w·x|. The exact path rounds only its sums.
                    return compare(download(dev, y), want, mag, int8 ? 1e-2 : 2e-6);
                });
            }
        }
    }
    // The fused form: matrices of mixed types over one input, each as matmul alone gives it.
    std::vector<std::unique_ptr<Weight>> ws;
    for (auto [type, rows] : {std::pair{kQ8_0, int64_t{43}}, {kTQ2_0, 16}, {kF32, 9}, {kQ2_0, 24}, {kQ4_K, 8}}) {
        ws.push_back(make_weight(type, n_in, rows, 1.25f, g));
        ws.back()->m.prepared = dev.prepare(ws.back()->m, Device::Use::matmul);
    }
    for (bool int8 : {true, false})
        for (int64_t B : {int64_t{1}, int64_t{5}, int64_t{16}})
            run_case(t, std::string("matmuls fused") + (int8 ? " int8" : " exact"), target, "tokens " + std::to_string(B), [&] {
                const std::vector<float> x = normal(g, static_cast<size_t>(B * n_in));
                Buffer xd = dev.upload(x);
                std::vector<Buffer> ys;
                std::vector<const Matrix*> mp;
                std::vector<DevPtr> yp;
                for (auto& w : ws) {
                    ys.push_back(dev.alloc(static_cast<size_t>(B * w->m.n_out)));
                    mp.push_back(&w->m);
                    yp.push_back(ys.back().ptr());
                }
                dev.matmuls(mp.data(), yp.data(), mp.size(), xd.ptr(), B, int8);
                Score s;
                for (size_t i = 0; i < ws.size(); ++i) {
                    std::vector<double> want, mag;
                    matmul_reference(*ws[i], x, B, want, mag);
                    merge(s, compare(download(dev, ys[i]), want, mag, int8 ? 1e-2 : 2e-6));
                }
                return s;
            });
}

void check_elementwise(Table& t, Device& dev, const std::string& target, std::mt19937& g) {
    run_case(t, "rmsnorm", target, "3 rows of 1001", [&] {
        const int64_t rows = 3, n = 1001;
        const std::vector<float> x = normal(g, static_cast<size_t>(rows * n), 0.3f, 2.f), w = normal(g, static_cast<size_t>(n), 1.f, 0.2f);
        Buffer xd = dev.upload(x), wd = dev.upload(w), out = dev.alloc(x.size());
        dev.rmsnorm(xd.ptr(), wd.ptr(), out.ptr(), rows, n, 1e-6);
        std::vector<double> want(x.size());
        for (int64_t r = 0; r < rows; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[static_cast<size_t>(r * n + i)]) * x[static_cast<size_t>(r * n + i)];
            const double inv = 1 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
            for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(r * n + i)] = x[static_cast<size_t>(r * n + i)] * inv * w[static_cast<size_t>(i)];
        }
        return compare(download(dev, out), want, magnitudes(want, 1e-6), 2e-6);
    });
    run_case(t, "swiglu", target, "10007 values", [&] {
        const int64_t n = 10007;
        const std::vector<float> gv = normal(g, static_cast<size_t>(n), 0, 4), u = normal(g, static_cast<size_t>(n));
        Buffer gd = dev.upload(gv), ud = dev.upload(u);
        dev.swiglu(gd.ptr(), ud.ptr(), n);
        std::vector<double> want(static_cast<size_t>(n));
        for (size_t i = 0; i < want.size(); ++i) want[i] = gv[i] / (1 + std::exp(-static_cast<double>(gv[i]))) * u[i];
        return compare(download(dev, gd), want, magnitudes(want, 1e-30), 2e-6);
    });
    run_case(t, "add", target, "1001 values", [&] {
        const std::vector<float> x = normal(g, 1001), y = normal(g, 1001);
        Buffer xd = dev.upload(x), yd = dev.upload(y);
        dev.add(xd.ptr(), yd.ptr(), 1001);
        std::vector<double> want(x.size());
        for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<double>(x[i]) + y[i];
        return compare(download(dev, xd), want, magnitudes(want, 1e-30), 1e-7);  // one f32 rounding
    });
    for (bool inverse : {false, true})
        run_case(t, "rotate", target, inverse ? "inverse, 3 rows of 1024 in blocks of 256" : "forward, 3 rows of 1024 in blocks of 256", [&] {
            const int64_t width = 1024, block = 256, B = 3;
            std::vector<float> signs(static_cast<size_t>(width));
            for (float& s : signs) s = g() % 2 ? 1.f : -1.f;
            Rotation r;
            r.width = width, r.block = block, r.signs = signs.data(), r.inverse = inverse;
            const std::vector<float> x = normal(g, static_cast<size_t>(B * width));
            Buffer xd = dev.upload(x), out = dev.alloc(x.size());
            dev.rotate(r, xd.ptr(), out.ptr(), B);
            // H[i][j] = (-1)^popcount(i & j) / sqrt(block) on each block; forward H·(s ⊙ x),
            // inverse s ⊙ (H·x).
            std::vector<double> want(x.size()), mag(x.size());
            for (int64_t b = 0; b < B; ++b)
                for (int64_t k0 = 0; k0 < width; k0 += block)
                    for (int64_t i = 0; i < block; ++i) {
                        double s = 0, a = 0;
                        for (int64_t j = 0; j < block; ++j) {
                            const double h = (__builtin_popcountll(static_cast<unsigned long long>(i & j)) % 2 ? -1.0 : 1.0) / std::sqrt(static_cast<double>(block));
                            const double xj = x[static_cast<size_t>(b * width + k0 + j)] * (inverse ? 1.0 : signs[static_cast<size_t>(k0 + j)]);
                            s += h * xj;
                            a += std::fabs(h * xj);
                        }
                        if (inverse) s *= signs[static_cast<size_t>(k0 + i)];
                        want[static_cast<size_t>(b * width + k0 + i)] = s;
                        mag[static_cast<size_t>(b * width + k0 + i)] = a + 1e-30;
                    }
            return compare(download(dev, out), want, mag, 2e-6);
        });
}

// Gated attention (device.h AttentionOp) in double over what the cache holds after the op:
// per-head RMSNorm of q and k, NeoX RoPE over the first R dims, K and V stored in binary16,
// causal softmax with GQA, the sigmoid gate.
void check_attention(Table& t, Device& dev, const std::string& target, std::mt19937& g) {
    struct Shape {
        int64_t H, Hkv, D, R, B, pos0;
    };
    const Shape shapes[] = {{8, 2, 64, 32, 1, 0}, {8, 2, 64, 32, 1, 37}, {8, 2, 64, 32, 5, 20}, {8, 2, 64, 32, 40, 0},
                            {4, 4, 32, 32, 33, 70}, {16, 1, 16, 8, 3, 700}};
    for (const Shape& sh : shapes) {
        const std::string what = "H " + std::to_string(sh.H) + "/" + std::to_string(sh.Hkv) + " D " + std::to_string(sh.D) + " R " +
                                 std::to_string(sh.R) + " B " + std::to_string(sh.B) + " at " + std::to_string(sh.pos0);
        const int64_t H = sh.H, Hkv = sh.Hkv, D = sh.D, R = sh.R, B = sh.B, pos0 = sh.pos0, G = H / Hkv;
        const double base = 10000.0, eps = 1e-6, scale = 1 / std::sqrt(static_cast<double>(D));
        const std::vector<float> qg = normal(g, static_cast<size_t>(B * 2 * H * D)), k = normal(g, static_cast<size_t>(B * Hkv * D)),
                                 v = normal(g, static_cast<size_t>(B * Hkv * D)), qn = normal(g, static_cast<size_t>(D), 1, 0.3f),
                                 kn = normal(g, static_cast<size_t>(D), 1, 0.3f), past = normal(g, static_cast<size_t>(2 * pos0 * Hkv * D), 0, 0.5f);
        Buffer qgd = dev.upload(qg), kd = dev.upload(k), vd = dev.upload(v), qnd = dev.upload(qn), knd = dev.upload(kn);
        Buffer out = dev.alloc(static_cast<size_t>(B * H * D));
        const size_t cache_n = static_cast<size_t>((pos0 + B) * Hkv * D);
        HalfBuffer kc(dev, cache_n), vc(dev, cache_n);
        std::vector<uint16_t> kp(static_cast<size_t>(pos0 * Hkv * D)), vp(kp.size());
        for (size_t i = 0; i < kp.size(); ++i) kp[i] = f32_to_fp16(past[i]), vp[i] = f32_to_fp16(past[kp.size() + i]);
        if (pos0) kc.upload(kp), vc.upload(vp);
        // A head normed with `w` and turned to position p, in double.
        auto norm_rope = [&](const float* x, const std::vector<float>& w, int64_t p) {
            std::vector<double> y(static_cast<size_t>(D));
            double ss = 0;
            for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(x[d]) * x[d];
            const double inv = 1 / std::sqrt(ss / static_cast<double>(D) + eps);
            for (int64_t d = 0; d < D; ++d) y[static_cast<size_t>(d)] = x[d] * inv * w[static_cast<size_t>(d)];
            for (int64_t i = 0; i < R / 2; ++i) {
                const double th = static_cast<double>(p) * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(R));
                const double a = y[static_cast<size_t>(i)], c = y[static_cast<size_t>(i + R / 2)];
                y[static_cast<size_t>(i)] = a * std::cos(th) - c * std::sin(th);
                y[static_cast<size_t>(i + R / 2)] = a * std::sin(th) + c * std::cos(th);
            }
            return y;
        };
        std::vector<uint16_t> kh, vh;
        run_case(t, "attention", target, what, [&] {
            AttentionOp op{qgd.ptr(), kd.ptr(), vd.ptr(), B, pos0, H, Hkv, D, R, base, eps, scale, qnd.ptr(), knd.ptr(), kc.ptr(), vc.ptr(), out.ptr()};
            dev.attention(&op, 1);
            kh = kc.download(), vh = vc.download();
            std::vector<double> want(static_cast<size_t>(B * H * D));
            for (int64_t b = 0; b < B; ++b)
                for (int64_t h = 0; h < H; ++h) {
                    const float* row = qg.data() + (b * H + h) * 2 * D;
                    const std::vector<double> q = norm_rope(row, qn, pos0 + b);
                    const int64_t kvh = h / G, keys = pos0 + b + 1;
                    std::vector<double> s(static_cast<size_t>(keys));
                    double m = -INFINITY, total = 0;
                    for (int64_t p = 0; p < keys; ++p) {
                        double dot = 0;
                        for (int64_t d = 0; d < D; ++d) dot += q[static_cast<size_t>(d)] * fp16_to_f32(kh[static_cast<size_t>((p * Hkv + kvh) * D + d)]);
                        s[static_cast<size_t>(p)] = dot * scale;
                        m = std::max(m, s[static_cast<size_t>(p)]);
                    }
                    for (double& e : s) total += (e = std::exp(e - m));
                    for (int64_t d = 0; d < D; ++d) {
                        double o = 0;
                        for (int64_t p = 0; p < keys; ++p) o += s[static_cast<size_t>(p)] * fp16_to_f32(vh[static_cast<size_t>((p * Hkv + kvh) * D + d)]);
                        want[static_cast<size_t>((b * H + h) * D + d)] = o / total / (1 + std::exp(-static_cast<double>(row[D + d])));
                    }
                }
            return compare(download(dev, out), want, magnitudes(want, 0.05), 1e-5);
        });
        run_case(t, "attention cache", target, what, [&] {
            // The past as it was; each new token's K (normed, turned) and V in binary16: V exactly
            // its rounding, K within one f16 step (a value at a rounding boundary may go either way).
            if (kh.size() != cache_n) throw std::runtime_error("the attention op did not run");
            Score s;
            s.ran = true;
            auto worse = [&](double err, double step, size_t at) {
                s.abs = std::max(s.abs, err);
                const double r = err / step;
                if (r > s.rel) s.rel = r;
                if (r > 1 && s.ok) s.ok = false, s.note = "cache value " + std::to_string(at) + " off by " + std::to_string(err);
            };
            auto step_of = [](double x) { return std::ldexp(1.0, std::ilogb(std::max(std::fabs(x), 6.1e-5)) - 10); };
            for (size_t i = 0; i < kp.size(); ++i) {
                worse(kh[i] == kp[i] ? 0 : INFINITY, 1, i);
                worse(vh[i] == vp[i] ? 0 : INFINITY, 1, i);
            }
            for (int64_t b = 0; b < B; ++b)
                for (int64_t j = 0; j < Hkv; ++j) {
                    const std::vector<double> kr = norm_rope(k.data() + (b * Hkv + j) * D, kn, pos0 + b);
                    for (int64_t d = 0; d < D; ++d) {
                        const size_t at = static_cast<size_t>(((pos0 + b) * Hkv + j) * D + d);
                        worse(std::fabs(fp16_to_f32(kh[at]) - kr[static_cast<size_t>(d)]), step_of(kr[static_cast<size_t>(d)]), at);
                        worse(vh[at] == f32_to_fp16(v[static_cast<size_t>((b * Hkv + j) * D + d)]) ? 0 : INFINITY, 1, at);
                    }
                }
            return s;
        });
    }
}

// Gated DeltaNet (device.h DeltaNetOp) in double: causal conv + SiLU over the window, q and k
// L2-normed per key head, the delta rule per value head (key head hh mod Hk), gated RMSNorm;
// the window and state after the tokens. With `tentative`, the state before is read from
// separate buffers and must be left as it was.
void check_deltanet(Table& t, Device& dev, const std::string& target, std::mt19937& g) {
    struct Shape {
        int64_t S, Hk, Hv, B;
        bool tentative;
    };
    const Shape shapes[] = {{32, 2, 4, 1, false}, {32, 2, 4, 5, true}, {64, 1, 2, 8, false}, {32, 2, 4, 40, false}, {128, 1, 1, 3, false},
                            {128, 1, 2, 33, true}};
    for (const Shape& sh : shapes) {
        const int64_t S = sh.S, Hk = sh.Hk, Hv = sh.Hv, B = sh.B, K = 4, kd = Hk * S, C = 2 * kd + Hv * S, VD = Hv * S;
        const double eps = 1e-6;
        const std::string what = "S " + std::to_string(S) + " heads " + std::to_string(Hk) + "/" + std::to_string(Hv) + " B " + std::to_string(B) +
                                 (sh.tentative ? " tentative" : "");
        const std::vector<float> qkv = normal(g, static_cast<size_t>(B * C)), z = normal(g, static_cast<size_t>(B * VD)),
                                 beta = normal(g, static_cast<size_t>(B * Hv)), alpha = normal(g, static_cast<size_t>(B * Hv)),
                                 conv = normal(g, static_cast<size_t>(C * K), 0, 0.5f), dt_bias = normal(g, static_cast<size_t>(Hv), 0, 0.5f),
                                 norm_w = normal(g, static_cast<size_t>(S), 1, 0.2f), window = normal(g, static_cast<size_t>((K - 1) * C)),
                                 state0 = normal(g, static_cast<size_t>(Hv * S * S), 0, 0.1f);
        std::vector<float> ssm_a(static_cast<size_t>(Hv));
        for (float& a : ssm_a) a = -std::exp(static_cast<float>(g() % 100) / 50.f - 1.f);
        Buffer qkv_d = dev.upload(qkv), z_d = dev.upload(z), beta_d = dev.upload(beta), alpha_d = dev.upload(alpha), conv_d = dev.upload(conv),
               dt_d = dev.upload(dt_bias), a_d = dev.upload(ssm_a), nw_d = dev.upload(norm_w), out = dev.alloc(static_cast<size_t>(B * VD));
        Buffer cs = dev.upload(sh.tentative ? std::vector<float>(window.size(), 7.f) : window),
               st = dev.upload(sh.tentative ? std::vector<float>(state0.size(), 7.f) : state0);
        Buffer cs_in = dev.upload(window), st_in = dev.upload(state0);
        // The reference.
        std::vector<double> y(static_cast<size_t>(B * C));
        for (int64_t b = 0; b < B; ++b)
            for (int64_t c = 0; c < C; ++c) {
                double acc = 0;
                for (int64_t tp = 0; tp < K; ++tp) {
                    const int64_t r = b + tp;
                    acc += static_cast<double>(conv[static_cast<size_t>(c * K + tp)]) *
                           (r < K - 1 ? window[static_cast<size_t>(r * C + c)] : qkv[static_cast<size_t>((r - (K - 1)) * C + c)]);
                }
                y[static_cast<size_t>(b * C + c)] = acc / (1 + std::exp(-acc));
            }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t m = 0; m < 2 * Hk; ++m) {  // q heads, then k heads
                double ss = 0;
                for (int64_t i = 0; i < S; ++i) ss += y[static_cast<size_t>(b * C + m * S + i)] * y[static_cast<size_t>(b * C + m * S + i)];
                for (int64_t i = 0; i < S; ++i) y[static_cast<size_t>(b * C + m * S + i)] /= std::sqrt(ss + eps);
            }
        std::vector<double> state(state0.begin(), state0.end()), want_out(static_cast<size_t>(B * VD));
        for (int64_t hh = 0; hh < Hv; ++hh) {
            double* s = state.data() + hh * S * S;
            const int64_t m = hh % Hk;
            for (int64_t b = 0; b < B; ++b) {
                const double* q = y.data() + b * C + m * S;
                const double* kk = y.data() + b * C + kd + m * S;
                const double* vv = y.data() + b * C + 2 * kd + hh * S;
                const double bt = 1 / (1 + std::exp(-static_cast<double>(beta[static_cast<size_t>(b * Hv + hh)])));
                const double xa = static_cast<double>(alpha[static_cast<size_t>(b * Hv + hh)]) + dt_bias[static_cast<size_t>(hh)];
                const double e = std::exp((xa > 20 ? xa : std::log1p(std::exp(xa))) * ssm_a[static_cast<size_t>(hh)]);
                std::vector<double> delta(static_cast<size_t>(S)), o(static_cast<size_t>(S));
                double kq = 0;
                for (int64_t i = 0; i < S; ++i) kq += kk[i] * q[i];
                for (int64_t j = 0; j < S; ++j) {
                    double sk = 0, sq = 0;
                    for (int64_t i = 0; i < S; ++i) sk += s[i * S + j] * kk[i], sq += s[i * S + j] * q[i];
                    delta[static_cast<size_t>(j)] = bt * (vv[j] - e * sk);
                    o[static_cast<size_t>(j)] = (e * sq + delta[static_cast<size_t>(j)] * kq) / std::sqrt(static_cast<double>(S));
                }
                for (int64_t i = 0; i < S; ++i)
                    for (int64_t j = 0; j < S; ++j) s[i * S + j] = e * s[i * S + j] + kk[i] * delta[static_cast<size_t>(j)];
                double ss = 0;
                for (double x : o) ss += x * x;
                const double inv = 1 / std::sqrt(ss / static_cast<double>(S) + eps);
                for (int64_t j = 0; j < S; ++j) {
                    const double zz = z[static_cast<size_t>(b * VD + hh * S + j)];
                    want_out[static_cast<size_t>(b * VD + hh * S + j)] = o[static_cast<size_t>(j)] * inv * norm_w[static_cast<size_t>(j)] * zz / (1 + std::exp(-zz));
                }
            }
        }
        std::vector<double> want_window(static_cast<size_t>((K - 1) * C));
        for (int64_t r = 0; r < K - 1; ++r)
            for (int64_t c = 0; c < C; ++c) {
                const int64_t at = B + r;  // row of [window; qkv]
                want_window[static_cast<size_t>(r * C + c)] = at < K - 1 ? window[static_cast<size_t>(at * C + c)] : qkv[static_cast<size_t>((at - (K - 1)) * C + c)];
            }
        run_case(t, "deltanet", target, what, [&] {
            DeltaNetOp op{qkv_d.ptr(), z_d.ptr(), beta_d.ptr(), alpha_d.ptr(), B, K, C, S, Hk, Hv, eps, conv_d.ptr(), dt_d.ptr(), a_d.ptr(), nw_d.ptr(),
                          cs.ptr(), st.ptr(), out.ptr()};
            if (sh.tentative) op.conv_state_in = cs_in.ptr(), op.state_in = st_in.ptr();
            dev.deltanet(&op, 1);
            // Outputs relative to their head's RMS-normed scale (|gated output| ~ 1).
            return compare(download(dev, out), want_out, magnitudes(want_out, 0.05), 2e-4);
        });
        run_case(t, "deltanet state", target, what, [&] {
            std::vector<double> rms(state.size());
            for (size_t hh = 0; hh < static_cast<size_t>(Hv); ++hh) {
                double ss = 0;
                for (int64_t i = 0; i < S * S; ++i) ss += state[hh * static_cast<size_t>(S * S) + static_cast<size_t>(i)] * state[hh * static_cast<size_t>(S * S) + static_cast<size_t>(i)];
                const double r = std::sqrt(ss / static_cast<double>(S * S));
                for (int64_t i = 0; i < S * S; ++i) rms[hh * static_cast<size_t>(S * S) + static_cast<size_t>(i)] = std::fabs(state[hh * static_cast<size_t>(S * S) + static_cast<size_t>(i)]) + r;
            }
            Score s = compare(download(dev, st), state, rms, 2e-5);
            merge(s, compare(download(dev, cs), want_window, magnitudes(want_window, 1e-30), 0));
            if (sh.tentative) {  // the state before, untouched
                std::vector<double> w0(state0.begin(), state0.end()), c0(window.begin(), window.end());
                merge(s, compare(download(dev, st_in), w0, magnitudes(w0, 1e-30), 0));
                merge(s, compare(download(dev, cs_in), c0, magnitudes(c0, 1e-30), 0));
            }
            return s;
        });
    }
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= s.size()) {
        const size_t comma = s.find(',', at);
        const std::string part = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        if (!part.empty()) out.push_back(part);
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> devices = device_names(), levels;
    std::string level_list = "all", require;
    bool quick = false;
    Table table;
    CLI::App app{"Every decoder device op on every CPU kernel level and the CUDA device, against a double-precision reference.",
                 "pulse-device-check"};
    pulse::args::style(app);
    app.footer("exit codes: 0 every op within tolerance, 1 a failure (or a --require'd device that did not run), 2 usage\n");
    app.add_option("--devices", devices, "the devices to check (default: cpu, and cuda where this build has it)")
        ->option_text("cpu,cuda")
        ->delimiter(',');
    app.add_option("--levels", level_list, "CPU kernel levels to run (this CPU's: all of them by default)")->option_text("all|LEVEL,...");
    app.add_option("--require", require, "a device that must run (without it, a CUDA device this machine cannot run is reported, not failed)")
        ->option_text("cuda")
        ->check(CLI::IsMember({"cuda"}));
    app.add_flag("--quick", quick, "fewer token counts for the matmuls");
    app.add_flag("--verbose", table.verbose, "every case with its errors, not only the table and the failures");
    if (auto exit = pulse::args::parse(app, argc, argv)) return *exit;
    const bool require_cuda = require == "cuda";
    if (level_list != "all") levels = split(level_list);
    const std::vector<std::string> have = kernel_levels();
    if (levels.empty()) levels = have;
    for (const auto& l : levels)
        if (std::find(have.begin(), have.end(), l) == have.end()) return pulse::args::usage_error(app, "this CPU cannot run kernel level '" + l + "'");

    std::printf("device-check: CPU kernel levels here: ");
    for (const auto& l : have) std::printf("%s ", l.c_str());
    std::printf("\n");
    bool cuda_missing = false;
    for (const std::string& d : devices) {
        const std::vector<std::string> runs = d == "cpu" ? levels : std::vector<std::string>{""};
        for (const std::string& level : runs) {
            const std::string target = d == "cpu" ? "cpu/" + level : d;
            limit_kernels(d == "cpu" ? level.c_str() : "");
            std::unique_ptr<Device> dev;
            try {
                std::string note;
                dev = make_device(d, &note);
                std::printf("  %s: %s\n", target.c_str(), note.c_str());
            } catch (const std::exception& e) {
                std::printf("  %s: not run: %s\n", target.c_str(), e.what());
                if (d == "cuda") cuda_missing = true;
                continue;
            }
            table.targets.push_back(target);
            std::mt19937 g(20261206);  // the same cases on every device and level
            check_embed(table, *dev, target, g);
            check_matmul(table, *dev, target, g, quick);
            check_elementwise(table, *dev, target, g);
            check_attention(table, *dev, target, g);
            check_deltanet(table, *dev, target, g);
        }
    }
    limit_kernels("");

    std::printf("\n| op |");
    for (const auto& tg : table.targets) std::printf(" %s |", tg.c_str());
    std::printf("\n|---|");
    for (size_t i = 0; i < table.targets.size(); ++i) std::printf("---|");
    std::printf("\n");
    int failed = 0;
    for (const auto& op : table.ops) {
        std::printf("| %s |", op.c_str());
        for (const auto& tg : table.targets) {
            const auto& row = table.cells[op];
            auto it = row.find(tg);
            if (it == row.end() || !it->second.ran) {
                std::printf(" not run: FAIL |");
                ++failed;
                continue;
            }
            const Score& s = it->second;
            std::printf(" %.1e / %.1e %s |", s.abs, s.rel, s.ok ? "ok" : "FAIL");
            failed += !s.ok;
        }
        std::printf("\n");
    }
    std::printf("\ncells: max |error| / max relative error (per op: of Σ|w·x| for products, of |value| plus a floor otherwise); tolerance per op in device_check.cpp\n");
    for (const auto& f : table.failures) std::printf("FAIL %s\n", f.c_str());
    if (require_cuda && cuda_missing) {
        std::printf("FAIL cuda: required, and it could not run here\n");
        ++failed;
    }
    const size_t cells = table.ops.size() * table.targets.size();
    std::printf("device-check: %zu passed, %d failed\n", cells - static_cast<size_t>(failed), failed);
    return failed ? 1 : 0;
}
