#include "tools/distill.h"

#include "format/quants.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
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
    // A running sequence: its tokens, their hidden rows, the logits of its last row.
    struct Run {
        const std::vector<int32_t>* prompt;
        std::unique_ptr<Sequence> seq;
        std::vector<int32_t> toks;
        std::vector<float> rows, logits;
        int64_t left = 0;  // tokens still to generate
    };
    std::vector<const std::vector<int32_t>*> todo;
    for (int s = 0; s < std::max(o.samples, 1); ++s)
        for (const auto& p : prompts)
            if (!p.empty()) todo.push_back(&p);
    const auto batch = static_cast<size_t>(std::clamp<int64_t>(o.batch, 1, Model::kMaxStepRows));
    for (size_t first = 0; first < todo.size(); first += batch) {
        std::vector<Run> runs;
        for (size_t i = first; i < std::min(todo.size(), first + batch); ++i) {
            Run r{todo[i], model.new_sequence(), *todo[i], {}, std::vector<float>(static_cast<size_t>(V)), 0};
            r.rows.resize(r.toks.size() * static_cast<size_t>(E));
            r.left = std::min(o.max_new, model.hparams().context_length - static_cast<int64_t>(r.toks.size()));
            runs.push_back(std::move(r));
        }
        // The prompts packed into steps of up to kMaxStepRows rows across the batch's sequences
        // (a prompt split over steps where it does not fit): chat prompts are often shorter than
        // a step, and each step reads the weights once.
        std::vector<size_t> prefilled(runs.size(), 0);
        for (;;) {
            std::vector<Segment> step;
            int64_t room = Model::kMaxStepRows;
            for (size_t k = 0; k < runs.size() && room > 0; ++k) {
                Run& r = runs[k];
                const auto n = static_cast<int64_t>(std::min(r.toks.size() - prefilled[k], static_cast<size_t>(room)));
                if (n == 0) continue;
                const bool last = prefilled[k] + static_cast<size_t>(n) == r.toks.size();
                step.push_back(Segment{r.seq.get(), r.toks.data() + prefilled[k], n, last ? r.logits.data() : nullptr, false,
                                       r.rows.data() + prefilled[k] * static_cast<size_t>(E)});
                prefilled[k] += static_cast<size_t>(n);
                room -= n;
            }
            if (step.empty()) break;
            model.step(step);
            ++sum.prompt_steps;
        }
        // The continuations in lockstep, one row per running sequence per step: the weights are
        // read once for all of them. Each generated token runs too, the last one included (its
        // hidden state is a row like any other).
        for (;;) {
            std::vector<Segment> step;
            for (auto& r : runs) {
                if (r.left <= 0) continue;
                const int32_t t = sampler.sample(r.logits.data(), V);
                r.toks.push_back(t);
                r.rows.resize(r.rows.size() + static_cast<size_t>(E));
                const bool end = std::find(end_tokens.begin(), end_tokens.end(), t) != end_tokens.end() || --r.left == 0;
                if (end) r.left = 0;
                step.push_back(Segment{r.seq.get(), &r.toks.back(), 1, end ? nullptr : r.logits.data(), false, r.rows.data() + r.rows.size() - static_cast<size_t>(E)});
            }
            if (step.empty()) break;
            model.step(step);
            ++sum.generation_steps;
        }
        for (const auto& r : runs) {
            const int64_t first_generated = sum.tokens + static_cast<int64_t>(r.prompt->size());
            tokens.append(r.toks.data(), static_cast<int64_t>(r.toks.size()), sizeof(int32_t));
            hidden.append(r.rows.data(), static_cast<int64_t>(r.toks.size()), sizeof(float));
            sum.tokens += static_cast<int64_t>(r.toks.size());
            sum.generated += static_cast<int64_t>(r.toks.size() - r.prompt->size());
            ++sum.sequences;
            starts.append(&sum.tokens, 1, sizeof sum.tokens);
            generated_from.append(&first_generated, 1, sizeof first_generated);
        }
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
                          {"generated", sum.generated}, {"max_new", o.max_new}, {"samples", o.samples}}) {
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

namespace pulse::decoder {

namespace {

void write_f32_npy(const std::filesystem::path& path, const std::vector<float>& v, int64_t width) {
    NpyWriter w(path, "<f4", width);
    w.append(v.data(), width ? static_cast<int64_t>(v.size()) / width : static_cast<int64_t>(v.size()), sizeof(float));
    w.close();
}

// A tensor as f32 in the layout export_head documents.
void write_tensor_npy(const TensorInfo& t, const std::filesystem::path& path) {
    std::vector<float> v(static_cast<size_t>(t.elements()));
    const uint64_t rows = t.rows(), cols = t.ne[0], row_bytes = t.row_bytes();
    for (uint64_t r = 0; r < rows; ++r) dequantize_row(t.type, t.data + r * row_bytes, v.data() + r * cols, static_cast<int64_t>(cols));
    write_f32_npy(path, v, t.ne.size() > 1 ? static_cast<int64_t>(cols) : 0);
}

}  // namespace

void export_head(Model& model, const std::filesystem::path& dir) {
    const GgufFile& f = model.file();
    const HParams& hp = model.hparams();
    if (!model.has_mtp()) throw GgufError(f.name() + ": no MTP block to train (no nextn_predict_layers)");
    for (const auto& [key, value] : f.metadata())
        if (key.rfind("prism.hadamard", 0) == 0) throw GgufError(f.name() + ": Hadamard-folded weights (" + key + "): export the unfolded twin instead");
    std::filesystem::create_directories(dir);
    const std::string block = "blk." + std::to_string(hp.n_layer) + ".";
    rapidjson::StringBuffer b;
    rapidjson::Writer<rapidjson::StringBuffer> w(b);
    w.StartObject();
    w.Key("format");
    w.String("pulse MTP head 1");
    w.Key("model");
    w.String(f.name().c_str());
    for (auto [key, v] : {std::pair<const char*, int64_t>{"n_embd", hp.n_embd}, {"n_vocab", hp.n_vocab}, {"n_ff", hp.n_ff}, {"n_head", hp.n_head},
                          {"n_head_kv", hp.n_head_kv}, {"head_dim", hp.head_dim}, {"rope_dim", hp.rope_dim}, {"block", hp.n_layer}}) {
        w.Key(key);
        w.Int64(v);
    }
    for (auto [key, v] : {std::pair<const char*, double>{"rope_base", hp.rope_base}, {"rms_eps", hp.rms_eps}, {"attn_scale", hp.attn_scale}}) {
        w.Key(key);
        w.Double(v);
    }
    w.Key("tensors");
    w.StartArray();
    for (const auto& t : f.tensors()) {
        if (t.name.rfind(block, 0) != 0) continue;
        write_tensor_npy(t, dir / (t.name + ".npy"));
        w.StartObject();
        w.Key("name");
        w.String(t.name.c_str());
        w.Key("type");
        w.String(type_name(t.type).c_str());
        w.Key("ne");
        w.StartArray();
        for (uint64_t x : t.ne) w.Uint64(x);
        w.EndArray();
        w.EndObject();
    }
    w.EndArray();
    // The tables the block reads: its own copies where the file has them.
    auto first = [&](std::initializer_list<std::string> names) -> const TensorInfo& {
        for (const auto& n : names)
            if (const TensorInfo* t = f.tensor(n)) return *t;
        throw GgufError(f.name() + ": none of " + *names.begin() + "... in the file");
    };
    const std::pair<const char*, const TensorInfo*> tables[] = {
        {"embed", &first({block + "nextn.embed_tokens.weight", "token_embd.weight"})},
        {"head", &first({block + "nextn.shared_head_head.weight", "output.weight", "token_embd.weight"})},
        {"head_norm", &first({block + "nextn.shared_head_norm.weight", "output_norm.weight"})}};
    w.Key("tables");
    w.StartObject();
    for (const auto& [key, t] : tables) {
        write_tensor_npy(*t, dir / (std::string(key) + ".npy"));
        w.Key(key);
        w.String(t->name.c_str());
    }
    w.EndObject();
    w.EndObject();
    std::ofstream(dir / "head.json") << b.GetString() << "\n";

    // The check: the decoder's own block on a short sequence (the exact path: f32 activations).
    const int64_t E = hp.n_embd, V = hp.n_vocab, n = std::min<int64_t>(24, hp.context_length / 2);
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % V);
    auto seq = model.new_sequence();
    std::vector<float> hidden(static_cast<size_t>(n * E)), paired(static_cast<size_t>(n * E), 0.f), logits(static_cast<size_t>(n * V));
    {
        // The model's own setting comes back however the check ends.
        struct ExactFor {
            Model& m;
            bool was;
            ~ExactFor() { m.exact = was; }
        } guard{model, model.exact};
        model.exact = true;
        model.step({Segment{seq.get(), tokens.data(), n, nullptr, false, hidden.data()}});
        std::copy(hidden.begin(), hidden.end() - E, paired.begin() + E);
        model.mtp_step({Segment{seq.get(), tokens.data(), n, logits.data(), true, nullptr, paired.data()}});
    }
    NpyWriter tw(dir / "check_tokens.npy", "<i4", 0);
    tw.append(tokens.data(), n, sizeof(int32_t));
    tw.close();
    write_f32_npy(dir / "check_hidden_in.npy", paired, E);
    write_f32_npy(dir / "check_logits.npy", logits, V);
}

namespace {

template <class T>
std::vector<T> read_npy(const std::filesystem::path& path, const std::string& descr, std::vector<int64_t>& shape) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path.string());
    char pre[10];
    in.read(pre, 10);
    if (!in || std::string(pre, 6) != "\x93NUMPY") throw std::runtime_error(path.string() + ": not a .npy file");
    size_t len = static_cast<uint8_t>(pre[8]) | (static_cast<size_t>(static_cast<uint8_t>(pre[9])) << 8);
    if (pre[6] >= 2) {  // version 2 and 3: a four-byte header length
        char more[2];
        in.read(more, 2);
        len |= (static_cast<size_t>(static_cast<uint8_t>(more[0])) << 16) | (static_cast<size_t>(static_cast<uint8_t>(more[1])) << 24);
    }
    std::string header(len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(len));
    if (header.find("'descr': '" + descr + "'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
        throw std::runtime_error(path.string() + ": expected " + descr + " in C order (" + header.substr(0, header.find('}') + 1) + ")");
    const size_t open = header.find("'shape': ("), close = header.find(')', open);
    if (open == std::string::npos || close == std::string::npos) throw std::runtime_error(path.string() + ": no shape in the header");
    shape.clear();
    int64_t count = 1;
    std::stringstream dims(header.substr(open + 10, close - open - 10));
    for (std::string d; std::getline(dims, d, ',');)
        if (d.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoll(d)), count *= shape.back();
    std::vector<T> v(static_cast<size_t>(count));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
    if (!in) throw std::runtime_error(path.string() + ": shorter than its shape");
    return v;
}

}  // namespace

std::vector<float> read_npy_f32(const std::filesystem::path& path, std::vector<int64_t>& shape) { return read_npy<float>(path, "<f4", shape); }

void count_generated(const std::filesystem::path& dir, std::vector<int64_t>& counts) {
    std::vector<int64_t> shape;
    const auto tokens = read_npy<int32_t>(dir / "tokens.npy", "<i4", shape);
    const auto starts = read_npy<int64_t>(dir / "starts.npy", "<i8", shape);
    const auto from = read_npy<int64_t>(dir / "generated_from.npy", "<i8", shape);
    if (starts.size() != from.size() + 1 || starts.back() != static_cast<int64_t>(tokens.size()))
        throw std::runtime_error(dir.string() + ": starts.npy, generated_from.npy and tokens.npy do not agree (not a collect directory?)");
    for (size_t s = 0; s < from.size(); ++s) {
        if (from[s] < starts[s] || from[s] > starts[s + 1]) throw std::runtime_error(dir.string() + ": generated_from.npy is outside sequence " + std::to_string(s));
        for (int64_t r = from[s]; r < starts[s + 1]; ++r) {
            const int32_t t = tokens[static_cast<size_t>(r)];
            if (t < 0 || t >= static_cast<int64_t>(counts.size()))
                throw std::runtime_error(dir.string() + ": token " + std::to_string(t) + " is outside the model's vocabulary of " + std::to_string(counts.size()));
            ++counts[static_cast<size_t>(t)];
        }
    }
}

std::vector<int32_t> rank_tokens(const std::vector<int64_t>& counts, int64_t top) {
    std::vector<int32_t> ids;
    for (size_t t = 0; t < counts.size(); ++t)
        if (counts[t] > 0) ids.push_back(static_cast<int32_t>(t));
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)]; });
    if (top > 0 && static_cast<int64_t>(ids.size()) > top) ids.resize(static_cast<size_t>(top));
    return ids;
}

int import_head(const GgufFile& f, const std::filesystem::path& dir, const std::filesystem::path& out) {
    GgufWriter w;
    for (const auto& [key, value] : f.metadata())
        if (key != "general.alignment") w.set_value(key, value);
    int replaced = 0;
    for (const auto& t : f.tensors()) {
        const std::filesystem::path trained = dir / (t.name + ".npy");
        if (std::filesystem::exists(trained)) {
            std::vector<int64_t> shape;
            const std::vector<float> v = read_npy_f32(trained, shape);
            std::vector<int64_t> want;
            if (t.ne.size() > 1) want = {static_cast<int64_t>(t.rows()), static_cast<int64_t>(t.ne[0])};
            else want = {static_cast<int64_t>(t.ne[0])};
            if (shape != want) throw GgufError(trained.string() + ": shape does not match " + t.name + " in " + f.name());
            w.add_tensor(t.name, t.ne, t.type, quantize(t.type, v.data(), static_cast<int64_t>(v.size())));
            ++replaced;
        } else {
            w.add_tensor_view(t.name, t.ne, t.type, t.data, t.rows() * t.row_bytes());  // the source file's mapped bytes
        }
    }
    w.write(out);
    return replaced;
}

}  // namespace pulse::decoder
