// libFuzzer: arbitrary bytes as a GGUF file through the reader, the qwen35 loader and, for
// small models that load, one forward step. Only GgufError (or a clean load) may come out:
// no crash, no out-of-bounds read, no hang.
#include <cstddef>
#include <cstdint>

#include "format/gguf.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace pulse::decoder;
    try {
        auto f = GgufFile::parse(data, size, "fuzz.gguf");
        auto m = Model::load(f);
        const auto& hp = m->hparams();
        if (hp.n_embd * hp.n_layer * (hp.n_ff + hp.conv_dim() + hp.n_head * hp.head_dim) < 2'000'000 && hp.n_vocab > 1) {
            auto seq = m->new_sequence();
            m->forward(*seq, {0, 1});
        }
    } catch (const GgufError&) {
    }
    return 0;
}
