// GGUF v3 reader: the file is mmap'd and every header, metadata and tensor-info field is
// validated before anything is used; tensor data is never copied. Any problem is one
// GgufError naming the file, the field or tensor, and what was expected.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pulse::decoder {

class GgufError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// ggml tensor types this decoder reads, and the names of the ones it rejects.
enum GgmlType : uint32_t {
    kF32 = 0,
    kF16 = 1,
    kQ8_0 = 8,
    kQ4_K = 12,
    kQ6_K = 14,
    kBF16 = 30,
    kTQ1_0 = 34,
    kTQ2_0 = 35,
    kQ1_0 = 41,     // mainline: group 128, {f16 d; u8 qs[16]}, one sign bit per weight
    kQ2_0 = 42,     // mainline: group 64, {f16 d; u8 qs[16]}, four 2-bit codes per byte
    kPQ2_0 = 142,   // PrismML fork: Q2_0's layout in groups of 128 (34 bytes)
    kPTQ1_0 = 143,  // PrismML fork: base-3 ternary in groups of 128 (28 bytes, scale last)
    // Not a ggml number: the reader gives it to tensors stored as type 42 whose byte size proves
    // the group-128 layout a fork shipped under mainline Q2_0's id (read like PQ2_0).
    kQ2_0_G128 = 1042,
};

struct TypeTraits {
    const char* name;
    uint32_t block;  // elements per block
    uint32_t bytes;  // bytes per block
    bool supported;
};
// nullptr for numbers no known ggml (or known fork) uses.
const TypeTraits* type_traits(uint32_t type);
std::string supported_type_names();  // "F32, F16, ...": for error messages
std::string type_name(uint32_t type);  // "Q8_0", or "unknown type 142"

enum class ValueType : uint32_t { u8 = 0, i8, u16, i16, u32, i32, f32, boolean, string, array, u64, i64, f64 };

struct Value {
    ValueType type = ValueType::u8;
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    std::string s;
    ValueType elem = ValueType::u8;  // arrays
    std::vector<Value> items;

    bool is_integer() const;
    bool is_float() const { return type == ValueType::f32 || type == ValueType::f64; }
};

struct TensorInfo {
    std::string name;
    std::vector<uint64_t> ne;  // ne[0] is the contiguous axis
    uint32_t type = 0;
    uint64_t offset = 0;  // from the start of the data section
    uint64_t nbytes = 0;
    const uint8_t* data = nullptr;
    uint64_t elements() const;
    uint64_t rows() const { return elements() / ne[0]; }
    uint64_t row_bytes() const;
    const class GgufFile* file = nullptr;  // the file it belongs to
};

class GgufFile {
public:
    // Maps and validates `path`. Throws GgufError.
    static std::shared_ptr<GgufFile> open(const std::filesystem::path& path);
    // Validates an in-memory image (fuzzing, tests); `bytes` must outlive the object.
    static std::shared_ptr<GgufFile> parse(const uint8_t* bytes, size_t size, const std::string& name);
    ~GgufFile();

    const std::string& name() const { return name_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    size_t file_size() const { return size_; }
    const std::map<std::string, Value>& metadata() const { return kv_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }

    const Value* find(const std::string& key) const;
    const TensorInfo* tensor(const std::string& name) const;
    // Typed access; throw GgufError "FILE: metadata KEY: ..." when missing or of another kind.
    uint64_t get_uint(const std::string& key) const;
    std::optional<uint64_t> opt_uint(const std::string& key) const;
    double get_float(const std::string& key) const;
    std::optional<double> opt_float(const std::string& key) const;
    std::string get_string(const std::string& key) const;
    std::optional<std::string> opt_string(const std::string& key) const;
    const Value& get_array(const std::string& key) const;
    const TensorInfo& get_tensor(const std::string& name) const;  // throws when absent
    // A hint that [p, p + n) of a tensor's data will not be read soon (its weights were copied
    // elsewhere): the whole pages in it leave this process's resident set and come back from
    // the file if read again. Nothing happens for an in-memory image (parse).
    void release_pages(const uint8_t* p, uint64_t n) const;

private:
    GgufFile() = default;
    void parse_all();
    void resolve_q2_0_layout(uint64_t data_size);

    std::string name_;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    void* map_ = nullptr;  // munmap'd in the destructor when set
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    std::map<std::string, Value> kv_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t> by_name_;
};

// Writes a GGUF v3 file (tests, synthetic models, the demo model). Setting a key again replaces it.
class GgufWriter {
public:
    void remove(const std::string& key);
    void set_u32(const std::string& key, uint32_t v);
    void set_u64(const std::string& key, uint64_t v);
    void set_i32(const std::string& key, int32_t v);
    void set_f32(const std::string& key, float v);
    void set_bool(const std::string& key, bool v);
    void set_string(const std::string& key, const std::string& v);
    void set_strings(const std::string& key, const std::vector<std::string>& v);
    void set_i32s(const std::string& key, const std::vector<int32_t>& v);
    void set_i64s(const std::string& key, const std::vector<int64_t>& v);
    void set_value(const std::string& key, const Value& v);  // any value as read (copying a file's metadata)
    void add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> data);
    // A tensor whose `size` bytes stay where they are (a mapped file's) until write(): a copy of
    // a large file is written without holding its tensors in memory.
    void add_tensor_view(const std::string& name, std::vector<uint64_t> ne, uint32_t type, const uint8_t* data, uint64_t size);
    std::vector<uint8_t> bytes(uint32_t alignment = 32) const;
    // Streams the file: the header, then each tensor's bytes in turn.
    void write(const std::filesystem::path& path) const;

private:
    struct Kv {
        std::string key;
        std::vector<uint8_t> encoded;  // type + value
    };
    struct T {
        std::string name;
        std::vector<uint64_t> ne;
        uint32_t type;
        std::vector<uint8_t> owned;
        const uint8_t* data;  // owned.data() or a view
        uint64_t size;
    };
    void store(Kv kv);
    std::vector<uint8_t> header(uint32_t alignment) const;  // up to the first tensor's bytes, padded
    // The file in order, piece by piece: the header, then each tensor's bytes and padding.
    void emit(uint32_t alignment, const std::function<void(const uint8_t*, size_t)>& put_bytes) const;
    std::vector<Kv> kv_;
    std::vector<T> tensors_;
};

}  // namespace pulse::decoder
