#include "format/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

namespace pulse::decoder {

namespace {

struct TypeRow {
    uint32_t id;
    TypeTraits t;
};
const TypeRow kTypes[] = {
    {0, {"F32", 1, 4, true}},        {1, {"F16", 1, 2, true}},       {2, {"Q4_0", 32, 18, false}},
    {3, {"Q4_1", 32, 20, false}},    {6, {"Q5_0", 32, 22, false}},   {7, {"Q5_1", 32, 24, false}},
    {8, {"Q8_0", 32, 34, true}},     {9, {"Q8_1", 32, 36, false}},   {10, {"Q2_K", 256, 84, false}},
    {11, {"Q3_K", 256, 110, false}}, {12, {"Q4_K", 256, 144, true}}, {13, {"Q5_K", 256, 176, false}},
    {14, {"Q6_K", 256, 210, true}},  {15, {"Q8_K", 256, 292, false}}, {16, {"IQ2_XXS", 256, 66, false}},
    {17, {"IQ2_XS", 256, 74, false}}, {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, false}}, {21, {"IQ3_S", 256, 110, false}}, {22, {"IQ2_S", 256, 82, false}},
    {23, {"IQ4_XS", 256, 136, false}}, {24, {"I8", 1, 1, false}},   {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},      {27, {"I64", 1, 8, false}},     {28, {"F64", 1, 8, false}},
    {29, {"IQ1_M", 256, 56, false}}, {30, {"BF16", 1, 2, true}},     {34, {"TQ1_0", 256, 54, true}},
    {35, {"TQ2_0", 256, 66, true}},  {39, {"MXFP4", 32, 17, false}}, {41, {"Q1_0", 128, 18, true}},
    {42, {"Q2_0", 64, 18, true}},
    // Forks seen in the wild (PrismML's llama.cpp for Ternary Bonsai).
    {142, {"PQ2_0", 128, 34, true}}, {143, {"PTQ1_0", 128, 28, true}},
    {kQ2_0_G128, {"Q2_0 (group-128 fork layout)", 128, 34, true}},
};

constexpr uint32_t kMaxDepth = 4;
constexpr uint64_t kMaxStringBytes = 1ull << 30;

class Cursor {
public:
    Cursor(const uint8_t* p, size_t n, const std::string& file) : p_(p), n_(n), file_(file) {}
    size_t pos() const { return pos_; }
    template <class T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p_ + pos_, sizeof v);
        pos_ += sizeof v;
        return v;
    }
    std::string str(const std::string& what) {
        uint64_t len = read<uint64_t>(what + " (string length)");
        if (len > kMaxStringBytes || len > n_ - pos_)
            fail(what + ": string of " + std::to_string(len) + " bytes runs past the end of the file (" + std::to_string(n_ - pos_) +
                 " bytes left)");
        std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
        pos_ += len;
        return s;
    }
    void need(size_t k, const std::string& what) {
        if (k > n_ - pos_) fail("truncated: " + what + " needs " + std::to_string(k) + " bytes at offset " + std::to_string(pos_) + ", the file ends at " + std::to_string(n_));
    }
    size_t left() const { return n_ - pos_; }
    [[noreturn]] void fail(const std::string& msg) const { throw GgufError(file_ + ": " + msg); }

private:
    const uint8_t* p_;
    size_t n_;
    size_t pos_ = 0;
    const std::string& file_;
};

const char* value_type_name(ValueType t) {
    static const char* n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    auto i = static_cast<uint32_t>(t);
    return i < 13 ? n[i] : "?";
}

Value read_value(Cursor& c, ValueType t, const std::string& what, uint32_t depth) {
    Value v;
    v.type = t;
    switch (t) {
        case ValueType::u8: v.u = c.read<uint8_t>(what); break;
        case ValueType::i8: v.i = c.read<int8_t>(what); break;
        case ValueType::u16: v.u = c.read<uint16_t>(what); break;
        case ValueType::i16: v.i = c.read<int16_t>(what); break;
        case ValueType::u32: v.u = c.read<uint32_t>(what); break;
        case ValueType::i32: v.i = c.read<int32_t>(what); break;
        case ValueType::f32: v.f = c.read<float>(what); break;
        case ValueType::u64: v.u = c.read<uint64_t>(what); break;
        case ValueType::i64: v.i = c.read<int64_t>(what); break;
        case ValueType::f64: v.f = c.read<double>(what); break;
        case ValueType::boolean: {
            uint8_t b = c.read<uint8_t>(what);
            if (b > 1) c.fail(what + ": bool must be 0 or 1, found " + std::to_string(b));
            v.b = b;
            break;
        }
        case ValueType::string: v.s = c.str(what); break;
        case ValueType::array: {
            if (depth >= kMaxDepth) c.fail(what + ": arrays nested deeper than " + std::to_string(kMaxDepth));
            uint32_t et = c.read<uint32_t>(what + " (array element type)");
            if (et > 12) c.fail(what + ": unknown array element type " + std::to_string(et) + " (expected 0-12)");
            uint64_t count = c.read<uint64_t>(what + " (array length)");
            // Every element takes at least one byte: a count beyond what is left is corrupt.
            if (count > c.left()) c.fail(what + ": array of " + std::to_string(count) + " elements cannot fit in the " + std::to_string(c.left()) + " bytes left");
            v.elem = static_cast<ValueType>(et);
            v.items.reserve(count);
            for (uint64_t k = 0; k < count; ++k) v.items.push_back(read_value(c, v.elem, what + "[" + std::to_string(k) + "]", depth + 1));
            break;
        }
        default: c.fail(what + ": unknown value type " + std::to_string(static_cast<uint32_t>(t)) + " (expected 0-12)");
    }
    return v;
}

}  // namespace

const TypeTraits* type_traits(uint32_t type) {
    for (const auto& r : kTypes)
        if (r.id == type) return &r.t;
    return nullptr;
}

std::string supported_type_names() {
    std::string s;
    for (const auto& r : kTypes)
        if (r.t.supported && r.id != kQ2_0_G128) s += (s.empty() ? "" : ", ") + std::string(r.t.name);
    return s;
}

std::string type_name(uint32_t type) {
    const TypeTraits* t = type_traits(type);
    return t ? std::string(t->name) : "unknown type " + std::to_string(type);
}

bool Value::is_integer() const {
    switch (type) {
        case ValueType::u8: case ValueType::i8: case ValueType::u16: case ValueType::i16: case ValueType::u32:
        case ValueType::i32: case ValueType::u64: case ValueType::i64: return true;
        default: return false;
    }
}

uint64_t TensorInfo::elements() const {
    uint64_t n = 1;
    for (uint64_t x : ne) n *= x;
    return n;
}

uint64_t TensorInfo::row_bytes() const {
    const TypeTraits* t = type_traits(type);
    return ne[0] / t->block * t->bytes;
}

std::shared_ptr<GgufFile> GgufFile::open(const std::filesystem::path& path) {
    std::shared_ptr<GgufFile> f(new GgufFile);
    f->name_ = path.string();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw GgufError(f->name_ + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw GgufError(f->name_ + ": not a regular file");
    }
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ < 24) {
        ::close(fd);
        throw GgufError(f->name_ + ": truncated: " + std::to_string(f->size_) + " bytes is less than a GGUF header (24)");
    }
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw GgufError(f->name_ + ": mmap failed (" + std::strerror(errno) + ")");
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
    f->parse_all();
    return f;
}

std::shared_ptr<GgufFile> GgufFile::parse(const uint8_t* bytes, size_t size, const std::string& name) {
    std::shared_ptr<GgufFile> f(new GgufFile);
    f->name_ = name;
    f->base_ = bytes;
    f->size_ = size;
    f->parse_all();
    return f;
}

GgufFile::~GgufFile() {
    if (map_) ::munmap(map_, size_);
}

void GgufFile::parse_all() {
    Cursor c(base_, size_, name_);
    uint32_t magic = c.read<uint32_t>("magic");
    if (magic != 0x46554747u) c.fail("not a GGUF file (magic is not \"GGUF\")");
    version_ = c.read<uint32_t>("version");
    if (version_ != 3) c.fail("GGUF version " + std::to_string(version_) + " is not supported (expected 3)");
    uint64_t n_tensors = c.read<uint64_t>("tensor count");
    uint64_t n_kv = c.read<uint64_t>("metadata count");
    // Each KV and tensor info takes well over 8 bytes: larger counts cannot be real.
    if (n_kv > size_ / 8) c.fail("metadata count " + std::to_string(n_kv) + " is impossible for a file of " + std::to_string(size_) + " bytes");
    if (n_tensors > size_ / 8) c.fail("tensor count " + std::to_string(n_tensors) + " is impossible for a file of " + std::to_string(size_) + " bytes");
    for (uint64_t k = 0; k < n_kv; ++k) {
        std::string key = c.str("metadata key #" + std::to_string(k));
        if (key.empty()) c.fail("metadata key #" + std::to_string(k) + " is empty");
        uint32_t t = c.read<uint32_t>("metadata " + key + " (value type)");
        if (t > 12) c.fail("metadata " + key + ": unknown value type " + std::to_string(t) + " (expected 0-12)");
        Value v = read_value(c, static_cast<ValueType>(t), "metadata " + key, 0);
        if (!kv_.emplace(key, std::move(v)).second) c.fail("metadata key " + key + " appears twice");
    }
    if (const Value* a = find("general.alignment")) {
        if (a->type != ValueType::u32) c.fail("metadata general.alignment: expected u32, found " + std::string(value_type_name(a->type)));
        if (a->u == 0 || (a->u & (a->u - 1)) || a->u > 65536) c.fail("metadata general.alignment = " + std::to_string(a->u) + ": must be a power of two up to 65536");
        alignment_ = a->u;
    }
    tensors_.reserve(n_tensors);
    for (uint64_t k = 0; k < n_tensors; ++k) {
        TensorInfo t;
        t.name = c.str("tensor #" + std::to_string(k) + " name");
        const std::string what = "tensor '" + t.name + "'";
        if (t.name.empty() || t.name.size() > 63) c.fail(what + ": name must be 1-63 bytes");
        uint32_t n_dims = c.read<uint32_t>(what + " dimension count");
        if (n_dims < 1 || n_dims > 4) c.fail(what + ": " + std::to_string(n_dims) + " dimensions (expected 1-4)");
        uint64_t elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            uint64_t ne = c.read<uint64_t>(what + " ne[" + std::to_string(d) + "]");
            if (ne == 0 || ne > (1ull << 40)) c.fail(what + ": ne[" + std::to_string(d) + "] = " + std::to_string(ne) + " (expected 1 to 2^40)");
            if (elements > (1ull << 48) / ne) c.fail(what + ": more than 2^48 elements");
            elements *= ne;
            t.ne.push_back(ne);
        }
        t.type = c.read<uint32_t>(what + " type");
        const TypeTraits* tt = type_traits(t.type);
        if (!tt || t.type == kQ2_0_G128) c.fail(what + ": unknown ggml type " + std::to_string(t.type) + " (a fork's format? supported: " + supported_type_names() + ")");
        if (!tt->supported)
            c.fail(what + ": ggml type " + std::string(tt->name) + " (" + std::to_string(t.type) +
                   ") is not supported (supported: " + supported_type_names() + ")");
        if (t.ne[0] % tt->block) c.fail(what + ": ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of " + tt->name + "'s block of " + std::to_string(tt->block));
        t.nbytes = elements / tt->block * tt->bytes;
        t.offset = c.read<uint64_t>(what + " offset");
        if (t.offset % alignment_) c.fail(what + ": offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(alignment_));
        if (!by_name_.emplace(t.name, tensors_.size()).second) c.fail("tensor name '" + t.name + "' appears twice");
        tensors_.push_back(std::move(t));
    }
    uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    if (data_start > size_ && !tensors_.empty()) c.fail("truncated: the tensor data section would start at " + std::to_string(data_start) + ", past the end (" + std::to_string(size_) + ")");
    uint64_t data_size = size_ > data_start ? size_ - data_start : 0;
    resolve_q2_0_layout(data_size);
    // Data regions: inside the file and not overlapping one another.
    std::vector<std::pair<uint64_t, size_t>> spans;
    for (size_t k = 0; k < tensors_.size(); ++k) {
        auto& t = tensors_[k];
        if (t.offset > data_size || t.nbytes > data_size - t.offset)
            c.fail("truncated: tensor '" + t.name + "' needs bytes " + std::to_string(t.offset) + "-" + std::to_string(t.offset + t.nbytes) +
                   " of the data section, which has " + std::to_string(data_size));
        t.data = base_ + data_start + t.offset;
        t.file = this;
        spans.emplace_back(t.offset, k);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t k = 1; k < spans.size(); ++k) {
        const auto& prev = tensors_[spans[k - 1].second];
        if (prev.offset + prev.nbytes > spans[k].first)
            c.fail("tensors '" + prev.name + "' and '" + tensors_[spans[k].second].name + "' overlap in the data section");
    }
}

// Type 42 is mainline Q2_0 (18 bytes per 64 weights), but a fork wrote its 34-byte groups of 128
// under the same number. The header cannot tell them apart; the space each tensor's data has
// up to the next tensor (or the end) can: the group-128 layout is 1/64 byte per weight smaller.
// A file uses one quantizer, so every type-42 tensor must agree; a tensor too small for the
// difference to exceed the padding decides nothing.
void GgufFile::resolve_q2_0_layout(uint64_t data_size) {
    std::vector<uint64_t> starts;
    for (const auto& t : tensors_) starts.push_back(t.offset);
    std::sort(starts.begin(), starts.end());
    int mainline = 0, fork = 0;
    std::string mainline_name, fork_name;
    for (const auto& t : tensors_) {
        if (t.type != kQ2_0) continue;
        auto next = std::upper_bound(starts.begin(), starts.end(), t.offset);
        uint64_t room = next == starts.end() ? (data_size > t.offset ? data_size - t.offset : 0) : *next - t.offset;
        const uint64_t n64 = t.nbytes, n128 = t.ne[0] % 128 ? 0 : t.elements() / 128 * 34;
        if (room >= n64) {
            if (n64 - n128 >= alignment_) ++mainline, mainline_name = t.name;  // a group-128 tensor would leave that much unused
        } else if (n128 && room >= n128 && room - n128 < alignment_) {
            ++fork, fork_name = t.name;  // exactly the group-128 size plus padding: not a truncated mainline tensor
        }
        // else: too small for either; the truncation check below names it
    }
    if (fork && mainline)
        throw GgufError(name_ + ": tensors of type 42 (Q2_0) disagree on their layout: '" + mainline_name +
                        "' has mainline Q2_0's size (groups of 64) and '" + fork_name +
                        "' the size of a fork's groups of 128; refusing to guess");
    if (!fork) return;
    for (auto& t : tensors_)
        if (t.type == kQ2_0) {
            if (t.ne[0] % 128)
                throw GgufError(name_ + ": tensor '" + t.name + "': type 42 is stored in a fork's groups of 128 in this file, but ne[0] = " +
                                std::to_string(t.ne[0]) + " is not a multiple of 128");
            t.type = kQ2_0_G128;
            t.nbytes = t.elements() / 128 * 34;
        }
}

void GgufFile::release_pages(const uint8_t* p, uint64_t n) const {
    if (!map_ || p < base_ || p + n > base_ + size_) return;
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page, hi = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

const Value* GgufFile::find(const std::string& key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

const TensorInfo* GgufFile::tensor(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::optional<uint64_t> GgufFile::opt_uint(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_integer()) throw GgufError(name_ + ": metadata " + key + ": expected an integer, found " + value_type_name(v->type));
    if (v->type == ValueType::i8 || v->type == ValueType::i16 || v->type == ValueType::i32 || v->type == ValueType::i64) {
        if (v->i < 0) throw GgufError(name_ + ": metadata " + key + " = " + std::to_string(v->i) + " must not be negative");
        return static_cast<uint64_t>(v->i);
    }
    return v->u;
}
uint64_t GgufFile::get_uint(const std::string& key) const {
    auto v = opt_uint(key);
    if (!v) throw GgufError(name_ + ": metadata " + key + " is required");
    return *v;
}
std::optional<double> GgufFile::opt_float(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_float()) return v->f;
    if (v->is_integer()) return static_cast<double>(v->type == ValueType::i32 || v->type == ValueType::i64 ? v->i : static_cast<int64_t>(v->u));
    throw GgufError(name_ + ": metadata " + key + ": expected a number, found " + value_type_name(v->type));
}
double GgufFile::get_float(const std::string& key) const {
    auto v = opt_float(key);
    if (!v) throw GgufError(name_ + ": metadata " + key + " is required");
    return *v;
}
std::optional<std::string> GgufFile::opt_string(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != ValueType::string) throw GgufError(name_ + ": metadata " + key + ": expected a string, found " + value_type_name(v->type));
    return v->s;
}
std::string GgufFile::get_string(const std::string& key) const {
    auto v = opt_string(key);
    if (!v) throw GgufError(name_ + ": metadata " + key + " is required");
    return *v;
}
const Value& GgufFile::get_array(const std::string& key) const {
    const Value* v = find(key);
    if (!v) throw GgufError(name_ + ": metadata " + key + " is required");
    if (v->type != ValueType::array) throw GgufError(name_ + ": metadata " + key + ": expected an array, found " + value_type_name(v->type));
    return *v;
}
const TensorInfo& GgufFile::get_tensor(const std::string& n) const {
    const TensorInfo* t = tensor(n);
    if (!t) throw GgufError(name_ + ": tensor '" + n + "' is required and missing");
    return *t;
}

// ---- writer -------------------------------------------------------------------------------------

namespace {
template <class T>
void put(std::vector<uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}
// A value's payload as the file stores it (its type written by the caller).
void put_value(std::vector<uint8_t>& out, const Value& v) {
    switch (v.type) {
        case ValueType::u8: put<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
        case ValueType::i8: put<int8_t>(out, static_cast<int8_t>(v.i)); break;
        case ValueType::u16: put<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
        case ValueType::i16: put<int16_t>(out, static_cast<int16_t>(v.i)); break;
        case ValueType::u32: put<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
        case ValueType::i32: put<int32_t>(out, static_cast<int32_t>(v.i)); break;
        case ValueType::f32: put<float>(out, static_cast<float>(v.f)); break;
        case ValueType::u64: put<uint64_t>(out, v.u); break;
        case ValueType::i64: put<int64_t>(out, v.i); break;
        case ValueType::f64: put<double>(out, v.f); break;
        case ValueType::boolean: put<uint8_t>(out, v.b ? 1 : 0); break;
        case ValueType::string: put_str(out, v.s); break;
        case ValueType::array:
            put<uint32_t>(out, static_cast<uint32_t>(v.elem));
            put<uint64_t>(out, v.items.size());
            for (const auto& item : v.items) put_value(out, item);
            break;
    }
}
}  // namespace

void GgufWriter::set_value(const std::string& key, const Value& v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, static_cast<uint32_t>(v.type));
    put_value(kv.encoded, v);
    store(std::move(kv));
}

void GgufWriter::store(Kv kv) {
    for (auto& e : kv_)
        if (e.key == kv.key) {
            e = std::move(kv);
            return;
        }
    kv_.push_back(std::move(kv));
}
void GgufWriter::remove(const std::string& key) {
    kv_.erase(std::remove_if(kv_.begin(), kv_.end(), [&](const Kv& e) { return e.key == key; }), kv_.end());
}
void GgufWriter::set_u32(const std::string& key, uint32_t v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 4);
    put(kv.encoded, v);
    store(std::move(kv));
}
void GgufWriter::set_i32(const std::string& key, int32_t v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 5);
    put(kv.encoded, v);
    store(std::move(kv));
}
void GgufWriter::set_f32(const std::string& key, float v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 6);
    put(kv.encoded, v);
    store(std::move(kv));
}
void GgufWriter::set_bool(const std::string& key, bool v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 7);
    put<uint8_t>(kv.encoded, v ? 1 : 0);
    store(std::move(kv));
}
void GgufWriter::set_string(const std::string& key, const std::string& v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 8);
    put_str(kv.encoded, v);
    store(std::move(kv));
}
void GgufWriter::set_strings(const std::string& key, const std::vector<std::string>& v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 9);
    put<uint32_t>(kv.encoded, 8);
    put<uint64_t>(kv.encoded, v.size());
    for (const auto& s : v) put_str(kv.encoded, s);
    store(std::move(kv));
}
void GgufWriter::set_i32s(const std::string& key, const std::vector<int32_t>& v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 9);
    put<uint32_t>(kv.encoded, 5);
    put<uint64_t>(kv.encoded, v.size());
    for (int32_t x : v) put(kv.encoded, x);
    store(std::move(kv));
}
void GgufWriter::set_u64(const std::string& key, uint64_t v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 10);
    put(kv.encoded, v);
    store(std::move(kv));
}
void GgufWriter::set_i64s(const std::string& key, const std::vector<int64_t>& v) {
    Kv kv{key, {}};
    put<uint32_t>(kv.encoded, 9);
    put<uint32_t>(kv.encoded, 11);
    put<uint64_t>(kv.encoded, v.size());
    for (int64_t x : v) put(kv.encoded, x);
    store(std::move(kv));
}
void GgufWriter::add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> data) {
    tensors_.push_back({name, std::move(ne), type, std::move(data), nullptr, 0});
    T& t = tensors_.back();
    t.data = t.owned.data();
    t.size = t.owned.size();
}

void GgufWriter::add_tensor_view(const std::string& name, std::vector<uint64_t> ne, uint32_t type, const uint8_t* data, uint64_t size) {
    tensors_.push_back({name, std::move(ne), type, {}, data, size});
}

std::vector<uint8_t> GgufWriter::header(uint32_t alignment) const {
    std::vector<uint8_t> out;
    put<uint32_t>(out, 0x46554747u);
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, kv_.size() + 1);
    for (const auto& kv : kv_) {
        put_str(out, kv.key);
        out.insert(out.end(), kv.encoded.begin(), kv.encoded.end());
    }
    put_str(out, "general.alignment");
    put<uint32_t>(out, 4);
    put<uint32_t>(out, alignment);
    uint64_t offset = 0;
    auto pad = [&](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
    for (const auto& t : tensors_) {
        put_str(out, t.name);
        put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
        for (uint64_t x : t.ne) put<uint64_t>(out, x);
        put<uint32_t>(out, t.type);
        put<uint64_t>(out, offset);
        offset = pad(offset + t.size);
    }
    out.resize(pad(out.size()), 0);
    return out;
}

void GgufWriter::emit(uint32_t alignment, const std::function<void(const uint8_t*, size_t)>& put_bytes) const {
    const auto head = header(alignment);
    put_bytes(head.data(), head.size());
    const std::vector<uint8_t> zeros(alignment, 0);
    for (const auto& t : tensors_) {
        put_bytes(t.data, t.size);
        put_bytes(zeros.data(), (alignment - t.size % alignment) % alignment);
    }
}

std::vector<uint8_t> GgufWriter::bytes(uint32_t alignment) const {
    std::vector<uint8_t> out;
    emit(alignment, [&](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
    return out;
}

void GgufWriter::write(const std::filesystem::path& path) const {
    std::ofstream out(path, std::ios::binary);
    emit(32, [&](const uint8_t* p, size_t n) { out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n)); });
    if (!out) throw GgufError(path.string() + ": cannot write");
}

}  // namespace pulse::decoder
