#include "distill.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace pulse::decoder {

namespace {
// The header's fixed size: magic, version 1.0, length, the dict padded with spaces and '\n'
// (NumPy asks for a multiple of 64), so the shape can be written last without moving the data.
constexpr size_t kHeaderBytes = 128;
}  // namespace

NpyWriter::NpyWriter(const std::filesystem::path& path, std::string descr, int64_t row_width)
    : path_(path), descr_(std::move(descr)), width_(row_width) {
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) throw std::runtime_error("cannot write " + path.string());
    header();
}

void NpyWriter::header() {
    std::string dict = "{'descr': '" + descr_ + "', 'fortran_order': False, 'shape': (" + std::to_string(rows_) +
                       (width_ ? ", " + std::to_string(width_) + ")" : ",)") + ", }";
    const size_t room = kHeaderBytes - 10;
    if (dict.size() + 1 > room) throw std::logic_error("npy header too long");
    dict.append(room - dict.size() - 1, ' ');
    dict += '\n';
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(room & 0xff), static_cast<unsigned char>(room >> 8)};
    if (std::fseek(f_, 0, SEEK_SET) != 0 || std::fwrite(pre, 1, sizeof pre, f_) != sizeof pre || std::fwrite(dict.data(), 1, dict.size(), f_) != dict.size())
        throw std::runtime_error("cannot write " + path_.string());
    std::fseek(f_, 0, SEEK_END);
}

void NpyWriter::append(const void* data, int64_t rows, size_t element_bytes) {
    const size_t n = static_cast<size_t>(rows * std::max<int64_t>(width_, 1));
    if (std::fwrite(data, element_bytes, n, f_) != n) throw std::runtime_error("cannot write " + path_.string() + " (disk full?)");
    rows_ += rows;
}

void NpyWriter::close() {
    if (!f_) return;
    header();
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!ok) throw std::runtime_error("cannot write " + path_.string());
}

NpyWriter::~NpyWriter() {
    if (f_) std::fclose(f_);
}

CollectSummary collect_hidden(const Model& model, const std::string& model_name, const std::vector<std::vector<int32_t>>& prompts,
                              const std::vector<int32_t>& end_tokens, const CollectOptions& o, const std::filesystem::path& dir) {
    const int64_t E = model.hparams().n_embd, V = model.hparams().n_vocab;
    std::filesystem::create_directories(dir);
    NpyWriter tokens(dir / "tokens.npy", "<i4", 0), hidden(dir / "hidden.npy", "<f4", E), starts(dir / "starts.npy", "<i8", 0),
        generated_from(dir / "generated_from.npy", "<i8", 0);
    Sampler sampler(o.sampling);
    CollectSummary sum;
    const int64_t zero = 0;
    starts.append(&zero, 1, sizeof zero);
    for (const auto& prompt : prompts) {
        if (prompt.empty()) continue;
        auto seq = model.new_sequence();
        std::vector<int32_t> toks = prompt;
        std::vector<float> rows, logits(static_cast<size_t>(V));
        // The prompt in steps of up to kMaxStepRows; each generated token run in turn, the last
        // one too (its hidden state is a row like any other).
        for (size_t i = 0; i < toks.size(); i += static_cast<size_t>(Model::kMaxStepRows)) {
            const auto n = static_cast<int64_t>(std::min(toks.size() - i, static_cast<size_t>(Model::kMaxStepRows)));
            rows.resize(rows.size() + static_cast<size_t>(n * E));
            const bool last = i + static_cast<size_t>(n) == toks.size();
            model.step({Segment{seq.get(), toks.data() + i, n, last ? logits.data() : nullptr, false, rows.data() + rows.size() - static_cast<size_t>(n * E)}});
        }
        const int64_t room = model.hparams().context_length - static_cast<int64_t>(toks.size());
        for (int64_t g = 0; g < std::min(o.max_new, room); ++g) {
            const int32_t t = sampler.sample(logits.data(), V);
            toks.push_back(t);
            rows.resize(rows.size() + static_cast<size_t>(E));
            const bool end = std::find(end_tokens.begin(), end_tokens.end(), t) != end_tokens.end() || g + 1 == std::min(o.max_new, room);
            model.step({Segment{seq.get(), &toks.back(), 1, end ? nullptr : logits.data(), false, rows.data() + rows.size() - static_cast<size_t>(E)}});
            if (end) break;
        }
        const int64_t first_generated = sum.tokens + static_cast<int64_t>(prompt.size());
        tokens.append(toks.data(), static_cast<int64_t>(toks.size()), sizeof(int32_t));
        hidden.append(rows.data(), static_cast<int64_t>(toks.size()), sizeof(float));
        sum.tokens += static_cast<int64_t>(toks.size());
        sum.generated += static_cast<int64_t>(toks.size() - prompt.size());
        ++sum.sequences;
        starts.append(&sum.tokens, 1, sizeof sum.tokens);
        generated_from.append(&first_generated, 1, sizeof first_generated);
    }
    for (NpyWriter* w : {&tokens, &hidden, &starts, &generated_from}) w->close();
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("format");
    w.String("pulse self-distillation data 1");
    w.Key("model");
    w.String(model_name.c_str());
    for (auto [key, v] : {std::pair<const char*, int64_t>{"n_embd", E}, {"n_vocab", V}, {"sequences", sum.sequences}, {"tokens", sum.tokens},
                          {"generated", sum.generated}, {"max_new", o.max_new}}) {
        w.Key(key);
        w.Int64(v);
    }
    w.Key("temperature");
    w.Double(o.sampling.temperature);
    w.Key("layout");
    w.String("tokens.npy int32 [N]; hidden.npy float32 [N, n_embd], the hidden state after the output norm at each row; "
             "starts.npy int64 [S+1]; generated_from.npy int64 [S]. Training pairs: (tokens[p], hidden[p-1]) -> tokens[p+1] within a "
             "sequence, zeros for the hidden state before its first row");
    w.EndObject();
    std::ofstream meta(dir / "meta.json");
    meta << b.GetString() << "\n";
    if (!meta) throw std::runtime_error("cannot write " + (dir / "meta.json").string());
    return sum;
}

}  // namespace pulse::decoder
