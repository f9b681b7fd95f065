// Writes seeded synthetic qwen35 GGUF files for the decoder's correctness fixtures:
//   make_synthetic OUT_DIR [SEED]   the fixture set (synthetic.h: every type, F32 twins, an odd shape)
//   make_synthetic --tiny FILE      one small F32 model (the GGUF fuzzer's seed)
//   make_synthetic --bench TYPE FILE  332.7M parameters (16 layers, E 1024) for tools/bench/decoder
//   make_synthetic --gpu TYPE FILE [LAYERS [VOCAB]]  Qwen3.5-27B's layer shapes, 16 layers by
//                                    default (6.1B parameters) for tools/gpu-check; VOCAB: filler
//                                    tokens up to that many (248320: the real vocabulary's head)
//   make_synthetic --scripted FILE FIRST THEN  a model that answers FIRST, then THEN once the prompt
//                                    holds a <tool_response> (synthetic.h: write_scripted_model)
//   make_synthetic --mtp --tiny|--bench|--gpu ...  the same model with an MTP (nextn) block after
//                                    its layers (random, like the rest: drafts it makes are random);
//                                    --mtp-own: the block with nextn embedding and head tables of its own
// TYPE: f32, f16, q8_0, q4_k, tq2_0, tq1_0, q2_0 or pq2_0, in any case.
#include <algorithm>
#include <cctype>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "args/args.h"
#include "format/gguf.h"
#include "tools/synthetic.h"

using namespace pulse::decoder;

int main(int argc, char** argv) {
    CLI::App app{"Seeded synthetic qwen35 GGUF files: the decoder's fixtures, the fuzzer's seed, benchmark and GPU-check models.",
                 "make_synthetic"};
    pulse::args::style(app);
    bool mtp = false, mtp_own = false;
    std::string tiny;
    std::vector<std::string> scripted, bench, gpu, fixtures;
    app.add_flag("--mtp", mtp, "with --tiny, --bench or --gpu: an MTP (nextn) block after the layers (random like the rest)");
    app.add_flag("--mtp-own", mtp_own, "the same, with nextn embedding and head tables of its own");
    CLI::Option_group* what = app.add_option_group("what to write (one)");
    what->add_option("--tiny", tiny, "one small F32 model (the GGUF fuzzer's seed)")->option_text("FILE");
    what->add_option("--scripted", scripted, "a model that answers FIRST, then THEN once the prompt holds a <tool_response>")
        ->option_text("FILE FIRST THEN")
        ->expected(3);
    what->add_option("--bench", bench, "332.7M parameters (16 layers, E 1024) for tools/bench/decoder")->option_text("TYPE FILE")->expected(2);
    what->add_option("--gpu", gpu,
                     "Qwen3.5-27B's layer shapes, 16 layers by default (6.1B parameters) for tools/gpu-check; VOCAB: filler tokens up "
                     "to that many (248320: the real vocabulary's head)")
        ->option_text("TYPE FILE [LAYERS [VOCAB]]")
        ->expected(2, 4);
    what->add_option("OUT_DIR", fixtures, "the fixture set (every type, F32 twins, an odd shape), from SEED (default 1)")
        ->type_name("[SEED]")
        ->expected(1, 2);
    what->require_option(1);
    if (auto exit = pulse::args::parse(app, argc, argv)) return *exit;

    const bool with_block = mtp || mtp_own;
    auto with_mtp = [&](SynthShape s) {
        s.mtp = with_block;
        s.mtp_own_tables = mtp_own;
        return s;
    };
    // TYPE, any case; an unknown one is an error (it used to mean F32, so `--bench Q8_0` wrote F32).
    auto type_of = [&](std::string t) -> std::optional<uint32_t> {
        static const std::map<std::string, uint32_t> types = {{"f32", kF32},     {"f16", kF16},   {"q8_0", kQ8_0}, {"q4_k", kQ4_K},
                                                              {"tq2_0", kTQ2_0}, {"tq1_0", kTQ1_0}, {"q2_0", kQ2_0}, {"pq2_0", kPQ2_0}};
        std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        auto it = types.find(t);
        if (it == types.end()) return std::nullopt;
        return it->second;
    };
    const char* kTypes = "f32, f16, q8_0, q4_k, tq2_0, tq1_0, q2_0 or pq2_0";
    if (!tiny.empty()) {
        write_synthetic(tiny, with_mtp(tiny_shape()), kF32, 7);
        return 0;
    }
    if (!scripted.empty()) {
        write_scripted_model(scripted[0], ScriptedAnswers{scripted[1], scripted[2]});
        return 0;
    }
    if (!bench.empty()) {
        auto type = type_of(bench[0]);
        if (!type) return pulse::args::usage_error(app, "--bench: TYPE '" + bench[0] + "' is not one of " + kTypes);
        write_synthetic(bench[1], with_mtp(bench_shape()), *type, 42);
        return 0;
    }
    if (!gpu.empty()) {
        auto type = type_of(gpu[0]);
        if (!type) return pulse::args::usage_error(app, "--gpu: TYPE '" + gpu[0] + "' is not one of " + kTypes);
        long layers = 16;
        long long vocab_size = 0;
        try {
            if (gpu.size() > 2) layers = std::stol(gpu[2]);
            if (gpu.size() > 3) vocab_size = std::stoll(gpu[3]);
        } catch (const std::exception&) {
            return pulse::args::usage_error(app, "--gpu: LAYERS and VOCAB are numbers");
        }
        if (layers < 1 || layers > 64) return pulse::args::usage_error(app, "--gpu: LAYERS must be 1 to 64");
        if (gpu.size() > 3 && (vocab_size < 512 || vocab_size > 262144)) return pulse::args::usage_error(app, "--gpu: VOCAB must be 512 to 262144");
        SynthShape shape = with_mtp(gpu_shape(layers));
        const SynthVocab vocab = synthetic_vocab(vocab_size);
        shape.vocab = &vocab;
        write_synthetic(gpu[1], shape, *type, 42);
        return 0;
    }
    if (with_block) return pulse::args::usage_error(app, "--mtp and --mtp-own go with --tiny, --bench or --gpu");
    uint64_t seed = 1;
    try {
        if (fixtures.size() > 1) seed = std::stoull(fixtures[1]);
    } catch (const std::exception&) {
        return pulse::args::usage_error(app, "SEED '" + fixtures[1] + "' is not a number");
    }
    std::filesystem::path out(fixtures[0]);
    std::filesystem::create_directories(out);
    for (const auto& f : fixture_set(seed)) write_synthetic(out / f.name, f.shape, f.type, f.seed, f.twin);
    std::printf("wrote the synthetic qwen35 fixture set to %s (seed %llu)\n", out.c_str(), static_cast<unsigned long long>(seed));
    return 0;
}
