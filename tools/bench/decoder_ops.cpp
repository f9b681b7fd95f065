// Benchmark (not a test): where a batched decode step's time goes, and what the kernels behind
// it cost alone. Four modes:
//
//   decoder_ops step MODEL.gguf [--streams 1,4] [--rows 1] [--steps 64] [--threads 2] [--rounds 3]
//     N sequences each given a 64-token prompt, then --steps decode steps of one token each
//     (--rows R > 1: R rows each, a verification of R - 1 drafts, all kept) through Model::step, the CPU device wrapped in one that times every op. Per round and N:
//     ms per step, tok/s, and ms per step in each kind of device op. The rounds alternate the
//     order of N (this machine drifts by more than the effects measured).
//
//   decoder_ops verify MODEL.gguf [--k 1,2,4,8] [--steps 32] [--threads 2] [--rounds 3] [--draft-vocab N]
//     What speculative decoding's steps cost against a plain one-token step, one sequence after a
//     64-token prompt: the main model over 1 + k rows (a verification: a tentative step with every
//     row's logits and hidden state, all rows kept; it and the one-token step timed in turn, run
//     by run), one draft token through the MTP block (a file with one), and the undo after a
//     rejection halfway (keeping 1 + k/2 rows of a tentative step: the recurrences replayed over
//     them) against running those rows again. Each run puts
//     the sequence back (not timed), so every step sees the same context. The rounds alternate
//     the order. --draft-vocab N: the MTP block drafts among N tokens (Model::set_draft_vocab).
//     A second table splits the one-token step and the verification by kind of device op
//     ("other": the time outside them), so the verification's extra time has an address.
//
//   decoder_ops tokenize MODEL.gguf --text FILE [--rounds 3]
//     The model's tokenizer over FILE (special tokens read, as a chat prompt is): bytes, tokens,
//     MB/s and tokens/s, best of --rounds. A Codex request is ~32 KB of text, a long session's
//     history a few hundred KB, all tokenized before the first prefill step.
//
//   decoder_ops kernels [--groups 8] [--reps 30]
//     One thread: the interleaved Q8_0 and TQ2_0 dots (dot_x16) over `groups` groups of eight
//     rows of 2048 weights (8: in L1; 4000: streaming from outer cache or memory), 1 to 8 tokens
//     (Q8_0) or 4 (TQ2_0), in ns per 8-row block (best of --reps) and against one token's time:
//     1.0 at four tokens means the extra tokens came free (bound by reading the weights), 4.0
//     that each costs what the first did (bound by arithmetic). Then one Gated DeltaNet head (S = 128) in
//     the recurrent form, AVX2 and this CPU's best, over 1 and 192 heads of state, in µs per
//     head: one token in place (a decode step) and five with the state before them kept (a
//     verification of four drafts).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "device/cpu/kernels.h"
#include "device/device.h"
#include "format/gguf.h"
#include "args/args.h"
#include "format/quants.h"
#include "model/model.h"
#include "model/tokenizer.h"

using namespace pulse::decoder;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Every op forwarded to a CPU device; the compute ops timed by kind.
class TimingDevice : public Device {
public:
    mutable std::map<std::string, double> spent;
    const char* name() const override { return "cpu (timed)"; }
    Buffer alloc(size_t n) const override { return cpu_->alloc(n); }
    void release(DevPtr p) const override { cpu_->release(p); }
    void upload(const float* h, DevPtr to, size_t n) const override { cpu_->upload(h, to, n); }
    void download(DevPtr from, float* h, size_t n) const override { cpu_->download(from, h, n); }
    void copy(DevPtr from, DevPtr to, size_t n) const override { cpu_->copy(from, to, n); }
    const void* prepare(const Matrix& w, Use use) override { return cpu_->prepare(w, use); }
    void embed(const Matrix& t, const int32_t* tok, int64_t B, DevPtr out) const override { timed("embed", [&] { cpu_->embed(t, tok, B, out); }); }
    void matmul(const Matrix& w, DevPtr x, int64_t B, DevPtr y, bool i8) const override { timed("matmul", [&] { cpu_->matmul(w, x, B, y, i8); }); }
    void matmuls(const Matrix* const* w, const DevPtr* y, size_t n, DevPtr x, int64_t B, bool i8) const override {
        timed("matmul", [&] { cpu_->matmuls(w, y, n, x, B, i8); });
    }
    void rmsnorm(DevPtr x, DevPtr w, DevPtr o, int64_t r, int64_t n, double e) const override { timed("norm, add, swiglu", [&] { cpu_->rmsnorm(x, w, o, r, n, e); }); }
    void swiglu(DevPtr g, DevPtr u, int64_t n) const override { timed("norm, add, swiglu", [&] { cpu_->swiglu(g, u, n); }); }
    void add(DevPtr x, DevPtr y, int64_t n) const override { timed("norm, add, swiglu", [&] { cpu_->add(x, y, n); }); }
    void rotate(const Rotation& r, DevPtr x, DevPtr o, int64_t B) const override { timed("rotate", [&] { cpu_->rotate(r, x, o, B); }); }
    void attention(const AttentionOp* ops, size_t n) const override { timed("attention", [&] { cpu_->attention(ops, n); }); }
    void deltanet(const DeltaNetOp* ops, size_t n) const override { timed("delta rule", [&] { cpu_->deltanet(ops, n); }); }

private:
    template <class F>
    void timed(const char* what, F f) const {
        const auto t0 = Clock::now();
        f();
        spent[what] += seconds_since(t0);
    }
    std::unique_ptr<Device> cpu_ = make_device("cpu");
};

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> out;
    for (size_t i = 0; i < s.size();) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        out.push_back(std::atoi(s.substr(i, j - i).c_str()));
        i = j + 1;
    }
    return out;
}

int step_mode(const std::string& path, const std::vector<int>& streams, int rows, int steps, int threads, int rounds) {
    if (rows < 1 || rows > 17) throw std::invalid_argument("--rows is 1 to 17");
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    auto dev = std::make_unique<TimingDevice>();
    TimingDevice* timing = dev.get();
    auto model = Model::load(GgufFile::open(path), std::move(dev));
    model->threads = threads;
    const int64_t V = model->hparams().n_vocab;
    std::printf("| round | streams | rows each | ms per step | rows/s | ms per step in each op |\n|---:|---:|---:|---:|---:|---|\n");
    for (int r = 1; r <= rounds; ++r) {
        std::vector<int> order = streams;
        if (r % 2 == 0) std::reverse(order.begin(), order.end());
        for (int n : order) {
            std::vector<std::unique_ptr<Sequence>> seqs;
            for (int s = 0; s < n; ++s) {
                seqs.push_back(model->new_sequence());
                model->forward(*seqs.back(), std::vector<int32_t>(64, 100 + s));
            }
            std::vector<float> logits(static_cast<size_t>(n * rows * V));
            std::vector<int32_t> tokens(static_cast<size_t>(rows), 200);
            timing->spent.clear();
            const auto t0 = Clock::now();
            for (int i = 0; i < steps; ++i) {
                std::vector<Segment> segs;
                for (int s = 0; s < n; ++s) {
                    // Several rows: a verification of rows - 1 drafts, all kept.
                    Segment sg{seqs[static_cast<size_t>(s)].get(), tokens.data(), rows, logits.data() + s * rows * V, rows > 1};
                    sg.tentative = rows > 1;
                    segs.push_back(sg);
                }
                model->step(segs);
                if (rows > 1)
                    for (auto& q : seqs) model->keep_tentative(*q, rows);
            }
            const double total = seconds_since(t0);
            std::string ops;
            for (const auto& [what, sec] : timing->spent) {
                char buf[96];
                std::snprintf(buf, sizeof buf, "%s%s %.2f", ops.empty() ? "" : ", ", what.c_str(), sec / steps * 1e3);
                ops += buf;
            }
            std::printf("| %d | %d | %d | %.2f | %.1f | %s |\n", r, n, rows, total / steps * 1e3, n * rows * steps / total, ops.c_str());
        }
    }
    std::printf("\nconditions: %d threads, 64-token prompts, %d decode steps per run, kernels %s\n", threads, steps, kernel_name());
    return 0;
}

int verify_mode(const std::string& path, const std::vector<int>& ks, int steps, int threads, int rounds, int64_t draft_vocab) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    // Each op timed (TimingDevice): where a verification's extra time goes, under the same
    // cache-flushed conditions as the ratio itself.
    auto dev = std::make_unique<TimingDevice>();
    TimingDevice* timing = dev.get();
    auto model = Model::load(GgufFile::open(path), std::move(dev));
    model->threads = threads;
    if (draft_vocab > 0) {  // the first N ids: the cost depends on the count only
        std::vector<int32_t> ids(static_cast<size_t>(std::min(draft_vocab, model->hparams().n_vocab)));
        std::iota(ids.begin(), ids.end(), 0);
        model->set_draft_vocab(ids);
    }
    const int64_t V = model->hparams().n_vocab, E = model->hparams().n_embd;
    auto seq = model->new_sequence();
    std::vector<int32_t> prompt(64);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 256);
    std::vector<float> hidden(static_cast<size_t>(64 * E));
    model->step({Segment{seq.get(), prompt.data(), 64, nullptr, false, hidden.data()}});
    if (model->has_mtp()) model->mtp_step({Segment{seq.get(), prompt.data(), 64, nullptr, false, nullptr, hidden.data()}});
    const int64_t base = seq->n_past;
    Sequence::RecurrentCheckpoint cp;
    seq->save_recurrent(cp);
    std::vector<float> logits(static_cast<size_t>(17 * V)), rows(static_cast<size_t>(17 * E)), h(static_cast<size_t>(E), 0.5f);
    // ms per run of `f` after `setup`, the sequence put back after each (only f timed). Before
    // each run the caches are flushed with a pass over 64 MiB: in a decode the Gated DeltaNet
    // states come from memory (the weights stream through between two steps), and here the
    // putting back would otherwise leave them in cache for a one-token step alone.
    std::vector<uint8_t> flush(size_t{64} << 20, 1);
    volatile uint64_t flushed = 0;
    using OpTimes = std::map<std::string, double>;
    auto run_once = [&](auto setup, auto f, OpTimes* ops = nullptr) {
        setup();
        uint64_t sum = 0;
        for (size_t b = 0; b < flush.size(); b += 64) sum += flush[b]++;
        flushed = flushed + sum;
        timing->spent.clear();
        const auto t0 = Clock::now();
        f();
        const double s = seconds_since(t0);
        if (ops) {
            double in_ops = 0;
            for (const auto& [what, sec] : timing->spent) {
                (*ops)[what] += sec;
                in_ops += sec;
            }
            (*ops)["other"] += s - in_ops;
        }
        seq->n_past = base;
        seq->mtp_n_past = base;
        seq->restore_recurrent(cp);
        return s;
    };
    auto time_after = [&](auto setup, auto f) {
        double total = 0;
        for (int i = 0; i < steps; ++i) total += run_once(setup, f);
        return total / steps * 1e3;
    };
    auto time = [&](auto f) { return time_after([] {}, f); };
    // Two ops' ms per run, their runs taken in turn: the ratio of the two (what a verification
    // costs against a one-token step) then sees the same machine, not two stretches of it.
    auto time_both = [&](auto f, auto g, OpTimes& f_ops, OpTimes& g_ops) {
        double a = 0, b = 0;
        for (int i = 0; i < steps; ++i) {
            a += run_once([] {}, f, &f_ops);
            b += run_once([] {}, g, &g_ops);
        }
        return std::pair<double, double>{a / steps * 1e3, b / steps * 1e3};
    };
    std::vector<int32_t> tokens(17, 200);
    auto step_rows = [&](int64_t n, bool tentative) {
        Segment s{seq.get(), tokens.data(), n, logits.data(), true, rows.data()};
        s.tentative = tentative;
        model->step({s});
    };
    // The undo after a rejection halfway: the recurrences replayed over the kept rows (what the
    // speculator does) against those rows run through the model again (what it did before).
    auto undo_replay = [&](int64_t k, int64_t kept) { return time_after([&] { step_rows(1 + k, true); }, [&] { model->keep_tentative(*seq, kept); }); };
    std::printf("| round | k | one token ms | verify (1 + k rows) ms | × one token | MTP draft token ms |"
                " undo: replay of 1 + k/2 rows ms | undo: re-run of them ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    std::vector<std::string> op_rows;
    for (int r = 1; r <= rounds; ++r) {
        std::vector<int> order = ks;
        if (r % 2 == 0) std::reverse(order.begin(), order.end());
        for (int k : order) {
            if (k < 1 || k > 16) throw std::invalid_argument("--k values must be 1 to 16");
            OpTimes one_ops, verify_ops;
            const auto [one, verify] = time_both([&] { step_rows(1, false); },
                                                 [&] {
                                                     step_rows(1 + k, true);
                                                     model->keep_tentative(*seq, 1 + k);
                                                 },
                                                 one_ops, verify_ops);
            for (const auto& [what, sec] : verify_ops) {
                char line[160];
                std::snprintf(line, sizeof line, "| %d | %d | %s | %.3f | %.3f | %+.3f |", r, k, what.c_str(), one_ops[what] / steps * 1e3, sec / steps * 1e3,
                              (sec - one_ops[what]) / steps * 1e3);
                op_rows.push_back(line);
            }
            const double draft = model->has_mtp() ? time([&] { model->mtp_step({Segment{seq.get(), tokens.data(), 1, logits.data(), false, rows.data(), h.data()}}); }) : 0;
            char drafted[32] = "(no block)";
            if (model->has_mtp()) std::snprintf(drafted, sizeof drafted, "%.2f", draft);
            const int64_t kept = 1 + k / 2;
            const double replay = undo_replay(k, kept);
            const double rerun = time([&] { model->step({Segment{seq.get(), tokens.data(), kept, nullptr, false, rows.data()}}); });
            std::printf("| %d | %d | %.2f | %.2f | %.2f | %s | %.3f | %.2f |\n", r, k, one, verify, verify / one, drafted, replay, rerun);
        }
    }
    std::printf("\n| round | k | op | one token ms | verify ms | extra ms |\n|---:|---:|---|---:|---:|---:|\n");
    for (const auto& line : op_rows) std::printf("%s\n", line.c_str());
    std::printf("\nconditions: %d threads, a 64-token prompt, %d runs each, kernels %s, %s activations, drafts among %lld of %lld tokens\n",
                threads, steps, kernel_name(), model->exact ? "f32" : "int8", static_cast<long long>(model->mtp_vocab()),
                static_cast<long long>(model->hparams().n_vocab));
    return 0;
}

int kernels_mode(int64_t groups, int reps) {
    groups = std::max<int64_t>(2, groups / 2 * 2);
    const int64_t n = 2048;
    std::mt19937 g(1);
    std::vector<float> x(static_cast<size_t>(kDotX16MaxTokens * n));
    for (auto& v : x) v = static_cast<float>(static_cast<int>(g() % 2001) - 1000) / 300.f;
    volatile float sink = 0;
    if (!has_x8()) std::printf("this CPU has no AVX512-VNNI: no interleaved kernels to measure\n");
    else std::printf("| type | tokens | ns per 8-row block | × one token |\n|---|---:|---:|---:|\n");
    for (uint32_t type : {kQ8_0, kTQ2_0}) {
        if (!has_x8()) break;
        const bool q8 = type == kQ8_0;
        const uint64_t gb = static_cast<uint64_t>(q8 ? n / 32 * kQ8x8Bytes : n / 256 * kTQ2x8Bytes);
        std::vector<uint8_t> packed(static_cast<size_t>(groups) * gb);
        for (auto& b : packed) b = static_cast<uint8_t>(g());
        QuantizedRows xq;
        xq.quantize(type, x.data(), dot_x16_tokens(type), n);
        const QuantRow* xr = xq.rows.data();
        const double blocks = static_cast<double>(groups) * static_cast<double>(n / (q8 ? 32 : 256));
        double one = 0;
        for (int T = 1; T <= dot_x16_tokens(type); ++T) {
            double best = 1e9;
            for (int rep = 0; rep < reps; ++rep) {
                float out[16 * kDotX16MaxTokens];
                const auto t0 = Clock::now();
                for (int64_t gi = 0; gi < groups; gi += 2) {
                    dot_x16(type, packed.data() + static_cast<uint64_t>(gi) * gb, gb, xr, T, n, out);
                    sink = sink + out[0];
                }
                best = std::min(best, seconds_since(t0));
            }
            if (T == 1) one = best;
            std::printf("| %s | %d | %.1f | %.2f |\n", q8 ? "q8_0" : "tq2_0", T, best / blocks * 1e9, best / one);
        }
    }
    // The row-at-a-time int8 kernels (matmul_rows_i8, the file's layout) at every level this CPU
    // has: the only int8 kernels on aarch64 (dotprod one row per token, i8mm two rows by two
    // tokens), and the path for rows the interleaved kernels do not take on x86.
    std::printf("\n| level | type | tokens | ns per 256 weights per token | × one token's time |\n|---|---|---:|---:|---:|\n");
    for (const std::string& level : kernel_levels()) {
        limit_kernels(level.c_str());
        for (uint32_t type : {kQ8_0, kTQ2_0}) {
            const uint64_t rb = static_cast<uint64_t>(type == kQ8_0 ? n / 32 * 34 : n / 256 * 66);
            const int64_t rows = 8 * groups;
            std::vector<uint8_t> w(static_cast<size_t>(rows) * rb);
            for (auto& b : w) b = static_cast<uint8_t>(g() & 0x3f);  // finite f16 scales
            QuantizedRows xq;
            xq.quantize(type, x.data(), 4, n);
            std::vector<float> y(static_cast<size_t>(4 * rows));
            double one = 0;
            for (int T = 1; T <= 4; ++T) {
                double best = 1e9;
                for (int rep = 0; rep < reps; ++rep) {
                    const auto t0 = Clock::now();
                    matmul_rows_i8(type, RowRange{w.data(), rb, 0, rows, y.data(), rows, 1.0f}, xq.rows.data(), T, n);
                    best = std::min(best, seconds_since(t0));
                    sink = sink + y[0];
                }
                if (T == 1) one = best;
                std::printf("| %s | %s | %d | %.2f | %.2f |\n", level.c_str(), type == kQ8_0 ? "q8_0" : "tq2_0", T,
                            best / static_cast<double>(rows * n / 256 * T) * 1e9, best / one);
            }
        }
    }
    limit_kernels("");
    const int64_t S = 128;
    // The recurrent delta rule as a decode step (one token, state updated in place) and as a
    // verification (five tokens, the state before them kept: read from one buffer, written to
    // another), over one head (in L2) and 192 (beyond it: a layer stack's worth).
    // Against the architecture's first vector level (AVX2, NEON), where this CPU has more.
    const auto levels = kernel_levels();
    const std::string base = levels.size() > 1 ? levels[1] : levels[0];
    std::printf("\n| state heads | tokens | state | recurrent delta rule, %s µs/head | this CPU's (%s) µs/head |\n|---:|---:|---|---:|---:|\n", base.c_str(), kernel_name());
    for (int heads : {1, 192})
        for (int T : {1, 5}) {
            const bool tentative = T > 1;
            std::vector<float> st(static_cast<size_t>(heads * S * S), 0.01f), before(tentative ? st.size() : 0, 0.01f);
            std::vector<float> qk(static_cast<size_t>(2 * S * T), 0.088f), v(static_cast<size_t>(S * T), 0.2f), out(static_cast<size_t>(S * T));
            std::vector<float> beta(static_cast<size_t>(T), 0.5f), log_decay(static_cast<size_t>(T), -0.1f);
            double best[2] = {1e9, 1e9};
            for (int rep = 0; rep < reps; ++rep)
                for (int fast = 0; fast < 2; ++fast) {
                    limit_kernels(fast ? "" : base.c_str());
                    const auto t0 = Clock::now();
                    for (int h = 0; h < heads; ++h) {
                        GdnHeadArgs a{st.data() + h * S * S, S, T, qk.data(), qk.data() + S, v.data(), beta.data(), log_decay.data(), 2 * S, S, 1, out.data(), S};
                        if (tentative) a.state_in = before.data() + h * S * S;
                        if (h + 1 < heads) {  // as the model runs a layer's heads: the next one fetched meanwhile
                            a.next_out = st.data() + (h + 1) * S * S;
                            a.next_in = tentative ? before.data() + (h + 1) * S * S : a.next_out;
                        }
                        gdn_head_recurrent(a);
                    }
                    best[fast] = std::min(best[fast], seconds_since(t0) / heads);
                    sink = sink + out[0];
                }
            limit_kernels("");
            std::printf("| %d | %d | %s | %.2f | %.2f |\n", heads, T, tentative ? "kept" : "in place", best[0] * 1e6, best[1] * 1e6);
        }
    std::printf("\nconditions: one thread, rows of %lld weights, %lld groups of eight rows, best of %d\n", static_cast<long long>(n), static_cast<long long>(groups), reps);
    return 0;
}

int tokenize_mode(const std::string& path, const std::string& text_path, int rounds) {
    std::ifstream in(text_path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + text_path);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    const Tokenizer tok = Tokenizer::load(*GgufFile::open(path));
    double best = 1e9;
    size_t tokens = 0;
    for (int r = 0; r < std::max(rounds, 1); ++r) {
        const auto t0 = Clock::now();
        tokens = tok.encode(text, true).size();
        best = std::min(best, seconds_since(t0));
    }
    std::printf("| text | bytes | tokens | ms | MB/s | tokens/s |\n|---|---:|---:|---:|---:|---:|\n| %s | %zu | %zu | %.2f | %.2f | %.0f |\n", text_path.c_str(),
                text.size(), tokens, best * 1e3, static_cast<double>(text.size()) / best / 1e6, static_cast<double>(tokens) / best);
    std::printf("\nconditions: one thread, %zu tokens in the vocabulary, best of %d\n", tok.size(), std::max(rounds, 1));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Per-op timings of the in-process decoder: a model step, MTP verification, the tokenizer, the kernels.", "decoder_ops"};
    pulse::args::style(app);
    std::string model, text, streams = "1,4", ks = "1,2,4,8";
    int rows = 1, steps = 0, threads = 2, rounds = 3, reps = 30;
    int64_t draft_vocab = 0, groups = 8;
    auto with_model = [&](CLI::App* c) { c->add_option("MODEL", model, "a qwen35 GGUF file")->type_name("")->required(); };
    auto timing = [&](CLI::App* c) {
        c->add_option("--steps", steps, "steps timed per round")->option_text("N");
        c->add_option("--threads", threads, "CPU threads (default 2)")->option_text("N");
        c->add_option("--rounds", rounds, "rounds, the best reported (default 3)")->option_text("N");
    };
    CLI::App* step = app.add_subcommand("step", "a model step for several streams and rows (--steps default 64)");
    with_model(step);
    step->add_option("--streams", streams, "stream counts (default 1,4)")->option_text("1,4");
    step->add_option("--rows", rows, "rows per stream (default 1)")->option_text("N");
    timing(step);
    CLI::App* verify = app.add_subcommand("verify", "MTP drafting and verification at each k (--steps default 32)");
    with_model(verify);
    verify->add_option("--k", ks, "drafts per step (default 1,2,4,8)")->option_text("1,2,...");
    verify->add_option("--draft-vocab", draft_vocab, "draft among the first N ids (0: all)")->option_text("N");
    timing(verify);
    CLI::App* tokenize = app.add_subcommand("tokenize", "the tokenizer on a text file");
    with_model(tokenize);
    tokenize->add_option("--text", text, "the text")->option_text("FILE")->required();
    tokenize->add_option("--rounds", rounds, "rounds, the best reported (default 3)")->option_text("N");
    CLI::App* kernels = app.add_subcommand("kernels", "each kernel level's matmuls");
    kernels->add_option("--groups", groups, "weight groups (default 8)")->option_text("N");
    kernels->add_option("--reps", reps, "repetitions (default 30)")->option_text("N");
    if (auto exit = pulse::args::parse(app, argc, argv)) return *exit;
    try {
        if (*step) return step_mode(model, parse_list(streams), rows, steps ? steps : 64, threads, rounds);
        if (*verify) return verify_mode(model, parse_list(ks), steps ? steps : 32, threads, rounds, draft_vocab);
        if (*tokenize) return tokenize_mode(model, text, rounds);
        if (*kernels) return kernels_mode(groups, reps);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "decoder_ops: %s\n", e.what());
        return 3;
    }
    return pulse::args::usage_error(app, "give a mode: step, verify, tokenize or kernels");
}
