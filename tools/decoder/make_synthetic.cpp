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
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "format/gguf.h"
#include "tools/synthetic.h"

using namespace pulse::decoder;

int main(int argc, char** argv) {
    const bool mtp_own = argc > 1 && std::string(argv[1]) == "--mtp-own", mtp = mtp_own || (argc > 1 && std::string(argv[1]) == "--mtp");
    if (mtp) --argc, ++argv;  // argv[0] is not read
    auto with_mtp = [&](SynthShape s) {
        s.mtp = mtp;
        s.mtp_own_tables = mtp_own;
        return s;
    };
    const std::string first = argc > 1 ? argv[1] : "";
    // An unknown option is not a directory to write into (a --help once left a "--help" tree).
    const bool known = first == "--tiny" || first == "--scripted" || first == "--bench" || first == "--gpu";
    if (argc < 2 || (!first.empty() && first[0] == '-' && !known)) {
        std::fprintf(stderr, "usage: make_synthetic OUT_DIR [SEED] | --tiny FILE | --scripted FILE CALL ANSWER | [--mtp] --bench TYPE FILE | [--mtp] --gpu TYPE FILE [LAYERS [VOCAB]]\n"
                             "       (--mtp or --mtp-own also before --tiny)\n");
        return first == "--help" || first == "-h" ? 0 : 2;
    }
    if (std::string(argv[1]) == "--tiny") {
        if (argc < 3) return 2;
        write_synthetic(argv[2], with_mtp(tiny_shape()), kF32, 7);
        return 0;
    }
    if (std::string(argv[1]) == "--scripted") {
        if (argc < 5) return 2;
        write_scripted_model(argv[2], ScriptedAnswers{argv[3], argv[4]});
        return 0;
    }
    if (std::string(argv[1]) == "--bench" || std::string(argv[1]) == "--gpu") {
        if (argc < 4) return 2;
        std::string t = argv[2];
        uint32_t type = t == "q8_0" ? kQ8_0 : t == "tq2_0" ? kTQ2_0 : t == "tq1_0" ? kTQ1_0 : t == "q4_k" ? kQ4_K : t == "f16" ? kF16 :
                        t == "q2_0" ? kQ2_0 : t == "pq2_0" ? kPQ2_0 : kF32;
        if (std::string(argv[1]) == "--bench") {
            write_synthetic(argv[3], with_mtp(bench_shape()), type, 42);
            return 0;
        }
        const long layers = argc > 4 ? std::strtol(argv[4], nullptr, 10) : 16;
        if (layers < 1 || layers > 64) {
            std::fprintf(stderr, "make_synthetic --gpu: LAYERS must be 1 to 64\n");
            return 2;
        }
        SynthShape shape = with_mtp(gpu_shape(layers));
        const long long vocab_size = argc > 5 ? std::strtoll(argv[5], nullptr, 10) : 0;
        if (argc > 5 && (vocab_size < 512 || vocab_size > 262144)) {
            std::fprintf(stderr, "make_synthetic --gpu: VOCAB must be 512 to 262144\n");
            return 2;
        }
        const SynthVocab vocab = synthetic_vocab(vocab_size);
        shape.vocab = &vocab;
        write_synthetic(argv[3], shape, type, 42);
        return 0;
    }
    if (mtp) {
        std::fprintf(stderr, "make_synthetic: --mtp and --mtp-own go with --tiny, --bench or --gpu\n");
        return 2;
    }
    std::filesystem::path out(argv[1]);
    std::filesystem::create_directories(out);
    uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
    for (const auto& f : fixture_set(seed)) write_synthetic(out / f.name, f.shape, f.type, f.seed, f.twin);
    std::printf("wrote the synthetic qwen35 fixture set to %s (seed %llu)\n", out.c_str(), static_cast<unsigned long long>(seed));
    return 0;
}
