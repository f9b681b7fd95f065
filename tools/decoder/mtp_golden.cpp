// Records llama.cpp's own run of a qwen35 file's MTP block, the reference the decoder's MTP test
// holds to (tests/fixtures/decoder/mtp_golden.json). Built against the llama.cpp source that
// node-llama-cpp carries (tools/dev mtp-golden); run by tools/decoder/record-mtp-golden.
//   pulse-mtp-golden OUT.json MODEL.gguf [MODEL.gguf ...]
// Per file, as llama.cpp's draft-mtp speculation feeds the block: the prompt through the main
// model (every row's h_nextn), then through an MTP context, token p paired with the main row
// p-1 (zeros for the first): the block's logits at every prompt position. Then a greedy chain of
// four drafts after the prompt's last token, each fed the block's own h_nextn of the one before.
// Writes {"results": [{file, prompt, mtp_logits: [[n_vocab] per position], drafts: [ids],
// draft_logits: [[n_vocab] per draft]}]}.
#include <llama.h>

#include "llama-ext.h"  // the staging API draft-mtp uses: llama_set_embeddings_nextn and friends

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// The decoder tests' golden prompt (tools/decoder/golden.mjs): specials, bytes, merged tokens.
const std::vector<llama_token> kPrompt = {297, 72, 101, 108, 108, 111, 256, 258, 32, 119, 111, 114, 108, 100, 10, 298};
constexpr int kDrafts = 4;

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "pulse-mtp-golden: %s\n", what.c_str());
    std::exit(1);
}

void write_row(std::string& out, const float* row, int n) {
    out += "[";
    char buf[32];
    for (int i = 0; i < n; ++i) {
        std::snprintf(buf, sizeof buf, "%s%.9g", i ? "," : "", row[i]);
        out += buf;
    }
    out += "]";
}

// One batch for `ctx`: tokens at pos0..., every row's logits, and (MTP) each row's input hidden state.
void decode(llama_context* ctx, const std::vector<llama_token>& tokens, int pos0, const std::vector<float>* hidden, int n_embd) {
    const int n = static_cast<int>(tokens.size());
    llama_batch b = llama_batch_init(n, hidden ? n_embd : 0, 1);
    if (hidden) b.token = static_cast<llama_token*>(std::malloc(sizeof(llama_token) * static_cast<size_t>(n)));  // draft-mtp does the same: both
    for (int i = 0; i < n; ++i) {
        b.token[i] = tokens[static_cast<size_t>(i)];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    if (hidden) std::memcpy(b.embd, hidden->data(), sizeof(float) * static_cast<size_t>(n * n_embd));
    b.n_tokens = n;
    if (llama_decode(ctx, b) != 0) die("llama_decode failed");
    llama_batch_free(b);
}

std::string record(const char* path) {
    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = true;
    mp.n_gpu_layers = 0;
    mp.progress_callback = [](float, void*) { return true; };  // no progress dots
    llama_model* model = llama_model_load_from_file(path, mp);
    if (!model) die(std::string("cannot load ") + path);
    if (llama_model_n_layer_nextn(model) != 1) die(std::string(path) + " has no (single) MTP block");
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = cp.n_ubatch = 64;
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context* tgt = llama_init_from_model(model, cp);
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    llama_context* dft = llama_init_from_model(model, cp);
    if (!tgt || !dft) die("cannot make the contexts");
    llama_set_embeddings_nextn(tgt, true, /*masked*/ false);
    llama_set_embeddings_nextn(dft, true, /*masked*/ true);
    const int E = llama_model_n_embd_out(model);
    const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n = static_cast<int>(kPrompt.size());

    decode(tgt, kPrompt, 0, nullptr, E);
    std::vector<float> paired(static_cast<size_t>(n * E), 0.f);  // row p: the main h_nextn of p-1
    for (int p = 1; p < n; ++p) std::memcpy(paired.data() + p * E, llama_get_embeddings_nextn_ith(tgt, p - 1), sizeof(float) * static_cast<size_t>(E));
    std::vector<float> last_h(llama_get_embeddings_nextn_ith(tgt, n - 1), llama_get_embeddings_nextn_ith(tgt, n - 1) + E);
    const float* main_last = llama_get_logits_ith(tgt, n - 1);
    llama_token next = 0;
    for (int v = 1; v < V; ++v)
        if (main_last[v] > main_last[next]) next = v;

    decode(dft, kPrompt, 0, &paired, E);
    std::string out = "{\"file\":\"" + std::string(std::strrchr(path, '/') ? std::strrchr(path, '/') + 1 : path) + "\",\"prompt\":[";
    for (int i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(kPrompt[static_cast<size_t>(i)]);
    out += "],\"main_next\":" + std::to_string(next) + ",\"mtp_logits\":[";
    for (int p = 0; p < n; ++p) {
        if (p) out += ",";
        write_row(out, llama_get_logits_ith(dft, p), V);
    }
    // The chain: (next at n, main h of n-1) -> d1; (d1 at n+1, the block's own h) -> d2; ...
    out += "],\"drafts\":[";
    std::string logits_json;
    std::vector<float> h = last_h;
    llama_token tok = next;
    for (int i = 0; i < kDrafts; ++i) {
        decode(dft, {tok}, n + i, &h, E);
        const float* l = llama_get_logits_ith(dft, 0);
        llama_token d = 0;
        for (int v = 1; v < V; ++v)
            if (l[v] > l[d]) d = v;
        if (i) logits_json += ",";
        write_row(logits_json, l, V);
        out += (i ? "," : "") + std::to_string(d);
        std::memcpy(h.data(), llama_get_embeddings_nextn_ith(dft, 0), sizeof(float) * static_cast<size_t>(E));
        tok = d;
    }
    out += "],\"draft_logits\":[" + logits_json + "]}";
    llama_free(dft);
    llama_free(tgt);
    llama_model_free(model);
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: pulse-mtp-golden OUT.json MODEL.gguf [MODEL.gguf ...]\n");
        return 2;
    }
    llama_backend_init();
    llama_log_set([](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    }, nullptr);
    std::string json = "{\"recorded_with\":\"llama.cpp draft-mtp context, f16 KV cache, 2 threads\",\"results\":[";
    for (int i = 2; i < argc; ++i) json += (i > 2 ? "," : "") + record(argv[i]);
    json += "]}\n";
    FILE* f = std::fopen(argv[1], "w");
    if (!f || std::fwrite(json.data(), 1, json.size(), f) != json.size() || std::fclose(f) != 0) die(std::string("cannot write ") + argv[1]);
    llama_backend_free();
    return 0;
}
