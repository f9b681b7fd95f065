// The GGUF reader against corrupt and unsupported files, the weight formats and their element
// order, the Hadamard fold (plugins/decoder/format).
#include "decoder/decoder_test.h"

// ---- GGUF reader ----------------------------------------------------------------------------

TEST_CASE("gguf: a synthetic model parses; metadata and tensors are typed and in bounds") {
    auto b = tiny_bytes();
    auto f = GgufFile::parse(b.data(), b.size(), "tiny.gguf");
    CHECK(f->version() == 3);
    CHECK(f->get_string("general.architecture") == "qwen35");
    CHECK(f->get_uint("qwen35.embedding_length") == 32);
    CHECK(f->get_float("qwen35.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-6));
    CHECK(f->get_array("tokenizer.ggml.tokens").items.size() == 305);
    const auto& t = f->get_tensor("token_embd.weight");
    CHECK(t.ne == std::vector<uint64_t>{32, 305});
    CHECK(t.data >= b.data());
    CHECK(t.data + t.nbytes <= b.data() + b.size());
    CHECK_THROWS_WITH_AS(f->get_uint("qwen35.nope"), doctest::Contains("tiny.gguf: metadata qwen35.nope is required"), GgufError);
    CHECK_THROWS_WITH_AS(f->get_uint("general.architecture"), doctest::Contains("expected an integer, found string"), GgufError);
    CHECK_THROWS_WITH_AS(f->get_tensor("blk.99.attn_q.weight"), doctest::Contains("tensor 'blk.99.attn_q.weight' is required"), GgufError);
}

TEST_CASE("gguf: the writer streams a file equal to its in-memory bytes, with owned and borrowed tensor data") {
    TempDir d;
    const std::vector<uint8_t> borrowed = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};  // 5 f32, not a multiple of 32 bytes
    GgufWriter w;
    w.set_string("general.architecture", "qwen35");
    w.add_tensor("a", {3}, kF32, {0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64});
    w.add_tensor_view("b", {5}, kF32, borrowed.data(), borrowed.size());
    w.add_tensor("c", {1}, kF32, {0, 0, 128, 191});
    w.write(d / "w.gguf");
    const std::string file = pulse::test::read_file(d / "w.gguf");
    const auto mem = w.bytes();
    CHECK(std::vector<uint8_t>(file.begin(), file.end()) == mem);
    auto f = GgufFile::parse(mem.data(), mem.size(), "w.gguf");
    CHECK(std::vector<uint8_t>(f->get_tensor("b").data, f->get_tensor("b").data + 20) == borrowed);
    CHECK(reinterpret_cast<const float*>(f->get_tensor("c").data)[0] == -1.0f);
}

TEST_CASE("gguf: every truncation of a valid file is one clear error, never a crash") {
    auto b = tiny_bytes();
    int errors = 0;
    // Cut points across the header, metadata, tensor infos and data.
    for (size_t cut : {size_t(0), size_t(3), size_t(10), size_t(23), size_t(24), size_t(100), size_t(1000), size_t(5000), size_t(20000),
                       b.size() / 2, b.size() - 100, b.size() - 1}) {
        std::vector<uint8_t> t(b.begin(), b.begin() + static_cast<long>(cut));
        std::string e = parse_error(t);
        CAPTURE(cut);
        CHECK(e.find("x.gguf: ") == 0);
        errors += !e.empty();
    }
    CHECK(errors == 12);
    CHECK(parse_error(std::vector<uint8_t>(b.begin(), b.end() - 1)).find("truncated: tensor '") != std::string::npos);
}

TEST_CASE("gguf: header problems name the field") {
    Builder m;
    m.put<uint32_t>(0x12345678);
    m.b.resize(64);
    CHECK(parse_error(m.b).find("not a GGUF file") != std::string::npos);
    Builder v;
    v.header(0, 0, 2);
    CHECK(parse_error(v.b).find("GGUF version 2 is not supported (expected 3)") != std::string::npos);
    Builder huge;
    huge.header(1ull << 60, 0);
    CHECK(parse_error(huge.b).find("tensor count 1152921504606846976 is impossible") != std::string::npos);
}

TEST_CASE("gguf: metadata problems: duplicate keys, bad types, bad bools, lying lengths, deep arrays") {
    Builder dup;
    dup.header(0, 2);
    for (int i = 0; i < 2; ++i) {
        dup.str("a.key");
        dup.put<uint32_t>(4);
        dup.put<uint32_t>(1);
    }
    CHECK(parse_error(dup.b).find("metadata key a.key appears twice") != std::string::npos);
    Builder badtype;
    badtype.header(0, 1);
    badtype.str("k");
    badtype.put<uint32_t>(13);
    CHECK(parse_error(badtype.b).find("metadata k: unknown value type 13") != std::string::npos);
    Builder badbool;
    badbool.header(0, 1);
    badbool.str("flag");
    badbool.put<uint32_t>(7);
    badbool.put<uint8_t>(2);
    CHECK(parse_error(badbool.b).find("metadata flag: bool must be 0 or 1, found 2") != std::string::npos);
    Builder longstr;
    longstr.header(0, 1);
    longstr.str("s");
    longstr.put<uint32_t>(8);
    longstr.put<uint64_t>(1ull << 40);
    CHECK(parse_error(longstr.b).find("runs past the end of the file") != std::string::npos);
    Builder longarr;
    longarr.header(0, 1);
    longarr.str("arr");
    longarr.put<uint32_t>(9);
    longarr.put<uint32_t>(4);
    longarr.put<uint64_t>(1ull << 50);
    CHECK(parse_error(longarr.b).find("cannot fit in the") != std::string::npos);
    Builder deep;
    deep.header(0, 1);
    deep.str("nest");
    deep.put<uint32_t>(9);
    for (int i = 0; i < 6; ++i) {
        deep.put<uint32_t>(9);
        deep.put<uint64_t>(1);
    }
    CHECK(parse_error(deep.b).find("nested deeper than 4") != std::string::npos);
    Builder align;
    align.header(0, 1);
    align.str("general.alignment");
    align.put<uint32_t>(4);
    align.put<uint32_t>(48);
    CHECK(parse_error(align.b).find("general.alignment = 48: must be a power of two") != std::string::npos);
}

TEST_CASE("gguf: tensor problems: unknown and unsupported types by name and number, shapes, offsets, overlap") {
    auto one = [](uint32_t type, std::vector<uint64_t> ne, uint64_t off = 0, size_t data = 4096) {
        Builder t;
        t.header(1, 0);
        t.tensor("w", std::move(ne), type, off);
        t.pad_data(data);
        return parse_error(t.b);
    };
    CHECK(one(39, {256}).find("tensor 'w': ggml type MXFP4 (39) is not supported (supported: F32, F16, Q8_0, Q4_K, Q6_K, BF16, TQ1_0, TQ2_0, Q1_0, Q2_0, PQ2_0, PTQ1_0)") != std::string::npos);
    CHECK(one(77, {256}).find("tensor 'w': unknown ggml type 77") != std::string::npos);
    CHECK(one(2, {32}).find("ggml type Q4_0 (2) is not supported") != std::string::npos);
    CHECK(one(kQ8_0, {33}).find("ne[0] = 33 is not a multiple of Q8_0's block of 32") != std::string::npos);
    CHECK(one(kF32, {0}).find("ne[0] = 0") != std::string::npos);
    CHECK(one(kF32, {4}, 7).find("offset 7 is not a multiple of the alignment 32") != std::string::npos);
    CHECK(one(kF32, {2048}, 0, 100).find("truncated: tensor 'w' needs bytes 0-8192") != std::string::npos);
    CHECK(one(kF32, {1, 1, 1, 1, 1}).find("5 dimensions (expected 1-4)") != std::string::npos);
    Builder two;
    two.header(2, 0);
    two.tensor("a", {64}, kF32, 0);
    two.tensor("b", {64}, kF32, 128);  // a spans 0-256
    two.pad_data(1024);
    CHECK(parse_error(two.b).find("tensors 'a' and 'b' overlap") != std::string::npos);
    Builder same;
    same.header(2, 0);
    same.tensor("a", {8}, kF32, 0);
    same.tensor("a", {8}, kF32, 32);
    same.pad_data(64);
    CHECK(parse_error(same.b).find("tensor name 'a' appears twice") != std::string::npos);
}

TEST_CASE("gguf: the loader rejects other architectures and wrong shapes, naming the tensor") {
    TempDir d;
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.write(d / "llama.gguf");
    CHECK_THROWS_WITH_AS(Model::load(GgufFile::open(d / "llama.gguf")), doctest::Contains("general.architecture is 'llama'"), GgufError);
    CHECK_THROWS_WITH_AS(GgufFile::open(d / "missing.gguf"), doctest::Contains("missing.gguf: cannot open"), GgufError);
    // A model whose ffn_up has the wrong shape.
    auto b = tiny_bytes();
    auto f = GgufFile::parse(b.data(), b.size(), "tiny.gguf");
    const auto& up = f->get_tensor("blk.0.ffn_up.weight");
    size_t at = static_cast<size_t>(std::search(b.begin(), b.end(), up.name.begin(), up.name.end()) - b.begin()) + up.name.size();
    uint64_t ne1 = 63;  // was 64 (n_ff); the data size shrinks, still in bounds
    std::memcpy(b.data() + at + 4 + 8, &ne1, 8);
    CHECK_THROWS_WITH_AS(Model::load(GgufFile::parse(b.data(), b.size(), "tiny.gguf")),
                         doctest::Contains("tensor 'blk.0.ffn_up.weight' has shape [32, 63], expected [32, 64]"), GgufError);
}

// ---- weight formats ------------------------------------------------------------------------------

TEST_CASE("formats: the shared element decoders (blocks.h) cover every supported type with the reader's block sizes") {
    int covered = 0;
    for (uint32_t type = 0; type < 2048; ++type) {
        const TypeTraits* t = type_traits(type);
        bool known = blocks::with_type(type, [&](auto tag) {
            constexpr uint32_t T = decltype(tag)::type;
            REQUIRE(t != nullptr);
            CHECK(t->block == static_cast<uint32_t>(blocks::Format<T>::elems));
            CHECK(t->bytes == static_cast<uint32_t>(blocks::Format<T>::bytes));
            ++covered;
        });
        if (t && t->supported) CHECK_MESSAGE(known, type_name(type));
    }
    CHECK(covered == 13);
}

TEST_CASE("formats: the shared element decoders (what the CUDA kernels run) give the CPU row decoder's bits on random blocks of every type") {
    std::mt19937_64 rng(11);
    int types = 0;
    for (uint32_t type = 0; type < 2048; ++type)
        blocks::with_type(type, [&](auto tag) {
            constexpr uint32_t T = decltype(tag)::type;
            constexpr int E = blocks::Format<T>::elems, bytes = blocks::Format<T>::bytes;
            constexpr int nb = E == 1 ? 1024 : 64;
            std::vector<uint8_t> raw(static_cast<size_t>(nb * bytes));
            for (auto& b : raw) b = static_cast<uint8_t>(rng());
            std::vector<float> row(static_cast<size_t>(nb * E));
            dequantize_row(T, raw.data(), row.data(), nb * E);
            int mismatches = 0;
            for (int b = 0; b < nb; ++b)
                for (int j = 0; j < E; ++j) {
                    const float want = row[static_cast<size_t>(b * E + j)], got = blocks::element<T>(raw.data() + b * bytes, j);
                    if (!(std::memcmp(&want, &got, 4) == 0 || (std::isnan(want) && std::isnan(got)))) ++mismatches;
                }
            CAPTURE(type_name(T));
            CHECK(mismatches == 0);
            ++types;
        });
    CHECK(types == 13);
}

TEST_CASE("formats: fp16 and bf16 conversions") {
    CHECK(fp16_to_f32(0x3c00) == 1.0f);
    CHECK(fp16_to_f32(0xc000) == -2.0f);
    CHECK(fp16_to_f32(0x0001) == doctest::Approx(5.960464477539063e-08));  // smallest subnormal
    CHECK(f32_to_fp16(1.0f) == 0x3c00);
    CHECK(f32_to_fp16(65504.f) == 0x7bff);
    CHECK(f32_to_fp16(1e6f) == 0x7c00);             // overflow -> inf
    CHECK(f32_to_fp16(1.0f + 1.0f / 2048) == 0x3c00);  // halfway rounds to even
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
    for (float x : {0.1f, -3.75f, 1234.5f, 6.1e-5f}) CHECK(fp16_to_f32(f32_to_fp16(x)) == doctest::Approx(x).epsilon(1e-3));
}

TEST_CASE("formats: ternary weights round-trip exactly through TQ1_0, TQ2_0 (and Q8_0 within fp16)") {
    std::mt19937 g(3);
    std::vector<float> x(512);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(g() % 3) - 1) * 0.0625f;
    for (uint32_t t : {kTQ1_0, kTQ2_0, kF16, kBF16}) {
        auto q = quantize(t, x.data(), 512);
        std::vector<float> y(512);
        dequantize_row(t, q.data(), y.data(), 512);
        CHECK_MESSAGE(y == x, type_name(t));
    }
    auto q = quantize(kQ8_0, x.data(), 512);
    std::vector<float> y(512);
    dequantize_row(kQ8_0, q.data(), y.data(), 512);
    for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == doctest::Approx(x[i]).epsilon(1e-3));
}

TEST_CASE("formats: TQ2_0 and TQ1_0 element order follows the spec's byte layout") {
    // TQ2_0: byte qs[32h+m] holds elements 128h+m, +32, +64, +96 in bit pairs 0-1 ... 6-7.
    std::vector<uint8_t> b(66, 0x55);  // every code 1 -> 0
    b[33] = static_cast<uint8_t>((2 << 0) | (0 << 2) | (1 << 4) | (1 << 6));  // h=1, m=1
    uint16_t one = f32_to_fp16(1.0f);
    std::memcpy(b.data() + 64, &one, 2);
    std::vector<float> y(256);
    dequantize_row(kTQ2_0, b.data(), y.data(), 256);
    CHECK(y[129] == 1.0f);   // 128 + 1, bits 0-1 = 2 -> +1
    CHECK(y[161] == -1.0f);  // +32, bits 2-3 = 0 -> -1
    CHECK(y[0] == 0.0f);
    // TQ1_0: the most significant trit of qs[m] is element m.
    std::vector<float> x(256, 0.f);
    x[5] = 1.f;
    x[37] = -1.f;   // trit 1 of qs[5]
    x[250] = 1.f;   // qh part
    auto q = quantize(kTQ1_0, x.data(), 256);
    dequantize_row(kTQ1_0, q.data(), y.data(), 256);
    CHECK(y == x);
}

TEST_CASE("formats: Q4_K and Q6_K decode what they encode (within their step)") {
    std::mt19937 g(9);
    std::vector<float> x(1024);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(g() % 2001) - 1000) / 1000.f;
    for (const auto& entry : {std::pair{kQ4_K, 0.08f}, std::pair{kQ6_K, 0.02f}}) {
        const uint32_t t = entry.first;  // not a structured binding: Clang 14 refuses one in CHECK's lambda
        const float tol = entry.second;
        auto q = quantize(t, x.data(), 1024);
        CHECK(q.size() == (t == kQ4_K ? 4 * 144u : 4 * 210u));
        std::vector<float> y(1024);
        dequantize_row(t, q.data(), y.data(), 1024);
        float worst = 0;
        for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
        CHECK_MESSAGE(worst < tol, type_name(t) << " worst " << worst);
    }
}

TEST_CASE("formats: Q2_0 / PQ2_0 / Q1_0 / PTQ1_0 element order and codes follow their byte layouts") {
    uint16_t one = f32_to_fp16(1.0f);
    // Q2_0 (group 64) and PQ2_0 (group 128): scale first; element j in bits 2(j%4) of qs[j/4];
    // value (code - 1)·d, code 3 = +2d.
    for (const auto& entry : {std::pair{kQ2_0, 64}, std::pair{kPQ2_0, 128}, std::pair{kQ2_0_G128, 128}}) {
        const uint32_t t = entry.first;  // not a structured binding: Clang 14 refuses one in CAPTURE's lambda
        const int g = entry.second;
        std::vector<uint8_t> b(static_cast<size_t>(2 + g / 4), 0x55);  // every code 1 -> 0
        std::memcpy(b.data(), &one, 2);
        b[2 + 5] = static_cast<uint8_t>((3 << 0) | (0 << 2) | (2 << 4) | (1 << 6));  // elements 20..23
        std::vector<float> y(static_cast<size_t>(g));
        dequantize_row(t, b.data(), y.data(), g);
        CAPTURE(type_name(t));
        CHECK(y[20] == 2.0f);
        CHECK(y[21] == -1.0f);
        CHECK(y[22] == 1.0f);
        CHECK(y[23] == 0.0f);
        CHECK(std::count(y.begin(), y.end(), 0.0f) == g - 3);
    }
    {  // Q1_0: bit j%8 of qs[j/8]: 1 -> +d, 0 -> -d
        std::vector<uint8_t> b(18, 0);
        std::memcpy(b.data(), &one, 2);
        b[2 + 3] = 0x81;  // elements 24 and 31
        std::vector<float> y(128);
        dequantize_row(kQ1_0, b.data(), y.data(), 128);
        CHECK(y[24] == 1.0f);
        CHECK(y[31] == 1.0f);
        CHECK(std::count(y.begin(), y.end(), -1.0f) == 126);
    }
    {  // PTQ1_0: qs[m] (m < 16) holds elements 16t+m, qs[16+m] 80+8t+m, qh[j] 120+2t+j; scale last
        std::vector<float> x(128, 0.f);
        for (int e : {3, 19, 83, 91, 121, 127}) x[static_cast<size_t>(e)] = (e % 2) ? 1.f : -1.f;
        auto q = quantize(kPTQ1_0, x.data(), 128);
        REQUIRE(q.size() == 28);
        uint16_t d;
        std::memcpy(&d, q.data() + 26, 2);
        CHECK(d == one);
        // element 3 is the most significant trit of qs[3]: (1 + 1)·81 + (others 1)·(27+9+3+1)
        // qs[3] holds elements 3, 19, 35, 51, 67 (most significant trit first): codes 2 2 1 1 1
        CHECK(q[3] == static_cast<uint8_t>(((2 * 81 + 2 * 27 + 9 + 3 + 1) * 256 + 242) / 243));
        std::vector<float> y(128);
        dequantize_row(kPTQ1_0, q.data(), y.data(), 128);
        CHECK(y == x);
    }
}

TEST_CASE("formats: Q2_0 codes {-1,0,1,2}, Q1_0 signs and PTQ1_0 trits round-trip exactly") {
    std::mt19937 g(5);
    for (auto t : {kQ2_0, kPQ2_0, kQ1_0, kPTQ1_0}) {
        std::vector<float> x(1024);
        for (auto& v : x) {
            int c = t == kQ1_0 ? (g() % 2 ? 1 : -1) : t == kPTQ1_0 ? static_cast<int>(g() % 3) - 1 : static_cast<int>(g() % 4) - 1;
            v = static_cast<float>(c) * 0.03125f;
        }
        auto q = quantize(t, x.data(), 1024);
        CHECK(q.size() == 1024 / type_traits(t)->block * type_traits(t)->bytes);
        std::vector<float> y(1024);
        dequantize_row(t, q.data(), y.data(), 1024);
        CHECK_MESSAGE(y == x, type_name(t));
    }
}

// The child of the next test, in a process of its own: the CPU probe runs once per process, and
// in this one an earlier test has long made it.

TEST_CASE("gguf: type 42 in a fork's 34-byte groups of 128 is recognised by its size, never misread as mainline Q2_0") {
    // Two [256 x 16] weights of type 42, laid out as the writer of each layout would. (The
    // layouts differ by 1/64 byte per weight: 64 bytes here, more than the alignment padding.)
    auto file = [](uint64_t bytes_each) {
        Builder t;
        t.header(2, 0);
        t.tensor("a", {256, 16}, kQ2_0, 0);
        t.tensor("b", {256, 16}, kQ2_0, (bytes_each + 31) / 32 * 32);
        t.pad_data(static_cast<size_t>((bytes_each + 31) / 32 * 32 + bytes_each));
        return t.b;
    };
    const uint64_t mainline = 4096 / 64 * 18, fork = 4096 / 128 * 34;  // 1152 and 1088 bytes
    auto m = file(mainline);
    auto fm = GgufFile::parse(m.data(), m.size(), "m.gguf");
    CHECK(fm->tensor("a")->type == kQ2_0);
    CHECK(fm->tensor("b")->nbytes == mainline);
    auto f = file(fork);
    auto ff = GgufFile::parse(f.data(), f.size(), "f.gguf");
    CHECK(ff->tensor("a")->type == kQ2_0_G128);
    CHECK(ff->tensor("b")->type == kQ2_0_G128);
    CHECK(ff->tensor("b")->nbytes == fork);
    CHECK(type_name(kQ2_0_G128) == "Q2_0 (group-128 fork layout)");
    // The fork layout decodes like PQ2_0.
    std::vector<float> x(256);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 4) - 1);
    auto q = quantize(kPQ2_0, x.data(), 256);
    std::vector<float> y(256);
    dequantize_row(kQ2_0_G128, q.data(), y.data(), 256);
    CHECK(y == x);
    // One tensor of each layout: refused, naming both.
    Builder mix;
    mix.header(2, 0);
    mix.tensor("a", {256, 16}, kQ2_0, 0);     // 1152 bytes of room: mainline
    mix.tensor("b", {256, 16}, kQ2_0, 1152);  // 1088 bytes to the end: the fork's size
    mix.pad_data(1152 + fork);
    std::string err = parse_error(mix.b);
    CHECK(err.find("tensors of type 42 (Q2_0) disagree on their layout: 'a'") != std::string::npos);
    CHECK(err.find("'b'") != std::string::npos);
    // A mainline tensor cut short by less than the difference is a truncation, not a fork file.
    auto cut = file(mainline);
    cut.resize(cut.size() - 8);
    CHECK(parse_error(cut).find("truncated: tensor 'b'") != std::string::npos);
}

TEST_CASE("hadamard: the blockwise transform is the normalized Sylvester matrix and its own inverse") {
    std::mt19937 g(11);
    std::vector<float> x(256);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(g() % 2001) - 1000) / 1000.f;
    std::vector<float> y = x;
    hadamard_blocks(y.data(), 256, 64);
    for (int b = 0; b < 4; ++b)
        for (int i = 0; i < 64; i += 7) {
            double want = 0;
            for (int j = 0; j < 64; ++j) want += ((__builtin_popcount(i & j) % 2) ? -1.0 : 1.0) * x[b * 64 + j] / 8.0;
            CHECK(y[b * 64 + i] == doctest::Approx(want).epsilon(1e-5));
        }
    hadamard_blocks(y.data(), 256, 64);
    for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == doctest::Approx(x[i]).epsilon(1e-5));
}

namespace {
// The largest |logit| difference between two files over a fixed prompt, and the greedy
// continuations of each.
struct Compared {
    double worst = 0;
    std::vector<int> greedy_a, greedy_b;
};
Compared compare_files(const fs::path& a, const fs::path& b, size_t steps) {
    auto ma = Model::load(GgufFile::open(a)), mb = Model::load(GgufFile::open(b));
    ma->exact = mb->exact = true;  // the same function in f32 (the int8 path rounds the two differently)
    std::vector<int32_t> prompt = {297, 72, 101, 108, 108, 111, 256, 258, 32, 119, 111, 114, 108, 100, 10, 298};
    auto sa = ma->new_sequence(), sb = mb->new_sequence();
    auto la = ma->forward(*sa, prompt, true), lb = mb->forward(*sb, prompt, true);
    Compared c;
    for (size_t i = 0; i < la.size(); ++i) c.worst = std::max(c.worst, std::fabs(static_cast<double>(la[i]) - lb[i]));
    const int64_t V = ma->hparams().n_vocab;
    c.greedy_a = greedy_run(*ma, *sa, std::vector<float>(la.end() - V, la.end()), steps);
    c.greedy_b = greedy_run(*mb, *sb, std::vector<float>(lb.end() - V, lb.end()), steps);
    return c;
}
}  // namespace

TEST_CASE("hadamard: a folded PQ2_0 / PTQ1_0 file gives its unfolded twin's logits (untied, tied, one or many blocks)") {
    // The twin holds W = W'·H·diag(s) in F32 (and the embedding unrotated, ssm_out's columns in
    // tiled head order); the folded file the codes W' and the metadata. Both compute the same
    // function; they differ only in f32 rounding: the twin sums n products of dense weights,
    // the folded run adds a log2(block)-stage transform before each folded matmul. Measured
    // max |Δlogit| 4e-5 (PQ2_0) and 1.5e-4 (PTQ1_0) on logits of magnitude ~10, after four
    // layers of f32 rounding in different orders; 1e-3 allowed: still four orders of magnitude
    // below what a missing rotation or permutation gives (the next test: 8 to 13).
    TempDir d;
    SynthShape tied = small_foldable();  // tied output, eight or sixteen blocks per width
    tied.hadamard_block = 16;
    SynthShape untied;
    untied.hadamard_block = 256;  // one block per width of 256, two for n_ff
    struct Case {
        const char* name;
        SynthShape shape;
        uint32_t type;
    } cases[] = {{"untied-pq2_0", untied, kPQ2_0}, {"untied-ptq1_0", untied, kPTQ1_0}, {"tied-pq2_0", tied, kPQ2_0}};
    for (const auto& c : cases) {
        CAPTURE(c.name);
        write_synthetic(d / "folded.gguf", c.shape, c.type, 3);
        write_synthetic(d / "twin.gguf", c.shape, c.type, 3, true);
        auto r = compare_files(d / "folded.gguf", d / "twin.gguf", 16);
        MESSAGE(std::string(c.name) << ": max |logit(folded) - logit(twin)| = " << r.worst);
        CHECK(r.worst < 1e-3);
        CHECK(r.greedy_a == r.greedy_b);
    }
}

namespace {
// Rewrites fixture `src` as `dst` with the same tensors and metadata after `tweak`.
void rewrite_with(const fs::path& src, const fs::path& dst, const std::function<void(GgufWriter&)>& tweak) {
    auto ok = GgufFile::open(src);
    GgufWriter w;
    for (const auto& [key, v] : ok->metadata()) {
        if (key == "general.alignment") continue;  // the writer's own
        if (v.type == ValueType::string) w.set_string(key, v.s);
        else if (v.type == ValueType::u32) w.set_u32(key, static_cast<uint32_t>(v.u));
        else if (v.type == ValueType::i32) w.set_i32(key, static_cast<int32_t>(v.i));
        else if (v.type == ValueType::f32) w.set_f32(key, static_cast<float>(v.f));
        else if (v.type == ValueType::boolean) w.set_bool(key, v.b);
        else if (v.type == ValueType::array && v.elem == ValueType::string) {
            std::vector<std::string> items;
            for (const auto& i : v.items) items.push_back(i.s);
            w.set_strings(key, items);
        } else if (v.type == ValueType::array) {
            std::vector<int32_t> items;
            for (const auto& i : v.items) items.push_back(static_cast<int32_t>(i.i));
            w.set_i32s(key, items);
        }
    }
    tweak(w);
    for (const auto& t : ok->tensors()) w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    w.write(dst);
}

// The load error of fixture `ok` rewritten after `tweak` ("" when it loads).
std::string load_error_with(const fs::path& ok, const std::function<void(GgufWriter&)>& tweak) {
    const fs::path bad = ok.parent_path() / "bad.gguf";
    rewrite_with(ok, bad, tweak);
    try {
        Model::load(GgufFile::open(bad));
    } catch (const GgufError& e) {
        return e.what();
    }
    return "";
}

// The load error of a tiny folded fixture after `tweak` ("" when it loads).
std::string load_folded_with(const std::function<void(GgufWriter&)>& tweak) {
    TempDir d;
    SynthShape s = small_foldable();
    s.hadamard_block = 16;
    write_synthetic(d / "ok.gguf", s, kPQ2_0, 3);
    return load_error_with(d / "ok.gguf", tweak);
}
}  // namespace

// A corrupt size is refused before anything walks it: the fuzzer found a file claiming about a
// billion layers, which the loader walked (4 s, 42 s under ASan) before finding layer 4 missing.
TEST_CASE("gguf: sizes no file of that many tensors could back are a load error naming the key, before any walk") {
    TempDir d;
    write_synthetic(d / "ok.gguf", tiny_shape(), kF32, 7);
    auto load_with = [&](const std::function<void(GgufWriter&)>& tweak) { return load_error_with(d / "ok.gguf", tweak); };
    CHECK(load_with([](GgufWriter&) {}).empty());
    const size_t tensors = GgufFile::open(d / "ok.gguf")->tensors().size();
    CHECK(load_with([](GgufWriter& w) { w.set_u32("qwen35.block_count", 1'000'000'000); })
              .find("block_count 1000000000 asks for 1000000000 layers of at least 11 tensors each; the file has " + std::to_string(tensors) + " tensors") !=
          std::string::npos);
    CHECK(load_with([](GgufWriter& w) { w.set_u32("qwen35.attention.key_length", 1u << 31); })
              .find("attention.key_length is 2147483648, above the 16777216 this decoder supports") != std::string::npos);
    CHECK(load_with([](GgufWriter& w) { w.set_u32("qwen35.attention.head_count", 4'000'000'000u); })
              .find("attention.head_count is 4000000000, above") != std::string::npos);
    // 64-bit values past int64's range: no wrapped arithmetic on them (UBSan runs this too).
    CHECK(load_with([](GgufWriter& w) {
              w.set_u64("qwen35.block_count", uint64_t{1} << 63);
              w.set_u32("qwen35.nextn_predict_layers", 1);
          }).find("block_count 9223372036854775808 asks for 9223372036854775807 layers") != std::string::npos);
    CHECK(load_with([](GgufWriter& w) { w.set_u32("qwen35.nextn_predict_layers", 1'000'000); }).find("sizes must be positive") != std::string::npos);
    // Rotary sections far longer than the pairs cover them all, as sections of the pairs' length.
    CHECK(load_with([](GgufWriter& w) { w.set_i64s("qwen35.rope.dimension_sections", {int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62}); })
              .empty());
}

TEST_CASE("hadamard: a missing or inconsistent prism.hadamard.* key is a load error naming the key") {
    CHECK(load_folded_with([](GgufWriter&) {}).empty());  // the untouched rewrite loads
    auto has = [](const std::string& err, const std::string& want) {
        if (err.find(want) == std::string::npos) MESSAGE("got: " << err);
        return err.find(want) != std::string::npos;
    };
    CHECK(has(load_folded_with([](GgufWriter& w) { w.remove("prism.hadamard.sign_values"); }), "metadata prism.hadamard.sign_values is missing"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.remove("prism.hadamard.gdn_v_grouped"); }), "metadata prism.hadamard.gdn_v_grouped is missing"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_u32("prism.hadamard.version", 2); }), "prism.hadamard.version is 2; this decoder knows version 1"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_string("prism.hadamard.transform", "dct"); }),
              "prism.hadamard.transform is 'dct'; this decoder reads only 'normalized-sylvester-walsh-hadamard'"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_string("prism.hadamard.axis", "output"); }), "prism.hadamard.axis is 'output'"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_string("prism.hadamard.sign_mode", "seeded"); }), "prism.hadamard.sign_mode is 'seeded'"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_u32("prism.hadamard.block_size", 24); }), "prism.hadamard.block_size must be a power of two"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_u32("prism.hadamard.block_size", 256); }), "prism.hadamard.sign_widths holds 128, not a multiple of block_size 256"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_i32s("prism.hadamard.sign_values", std::vector<int32_t>(10, 1)); }),
              "prism.hadamard.sign_values has 10 values; sign_widths add up to"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_i32s("prism.hadamard.sign_widths", {128}); }),
              "prism.hadamard.sign_values has"));  // the values no longer add up
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_strings("prism.hadamard.weight_names", {"blk.0.ssm_beta.weight", "blk.9.ffn_up.weight"}); }),
              "prism.hadamard.weight_names lists 'blk.9.ffn_up.weight', which is not a weight this model multiplies (no such tensor)"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_strings("prism.hadamard.inverse_weight_names", {"output.weight"}); }),
              "prism.hadamard.inverse_weight_names lists 'output.weight'"));
    CHECK(has(load_folded_with([](GgufWriter& w) { w.set_u32("prism.hadamard.gdn_v_grouped", 1); }), "prism.hadamard.gdn_v_grouped must be a bool"));
    // A sign that is not ±1.
    CHECK(has(load_folded_with([](GgufWriter& w) {
              std::vector<int32_t> v(128 + 256, 1);  // widths 128 (E, value dim, H·D) and 256 (n_ff)
              v[40] = 0;
              w.set_i32s("prism.hadamard.sign_values", v);
          }),
              "prism.hadamard.sign_values[40] is not +1 or -1"));
}

TEST_CASE("hadamard: the fold matters: ignoring it, or only ssm_out's head permutation, breaks the model") {
    // Guards the tests above against a fold that does nothing: the folded codes read as plain
    // weights, or rotated without the tiled -> grouped head permutation, must not match the twin.
    TempDir d;
    SynthShape s;  // 2 key heads, 4 value heads: the permutation is not the identity
    s.hadamard_block = 128;
    write_synthetic(d / "twin.gguf", s, kPQ2_0, 3, true);
    write_synthetic(d / "folded.gguf", s, kPQ2_0, 3);
    CHECK(compare_files(d / "folded.gguf", d / "twin.gguf", 4).worst < 1e-3);
    rewrite_with(d / "folded.gguf", d / "ignored.gguf", [](GgufWriter& w) {
        for (const char* k : {"version", "transform", "axis", "sign_mode", "block_size", "sign_widths", "sign_values", "weight_names",
                              "inverse_weight_names", "gdn_v_grouped"})
            w.remove(std::string("prism.hadamard.") + k);
    });
    double ignored = compare_files(d / "ignored.gguf", d / "twin.gguf", 4).worst;
    rewrite_with(d / "folded.gguf", d / "ungrouped.gguf", [](GgufWriter& w) { w.set_bool("prism.hadamard.gdn_v_grouped", false); });
    double ungrouped = compare_files(d / "ungrouped.gguf", d / "twin.gguf", 4).worst;
    MESSAGE("max |Δlogit| vs the twin: fold ignored " << ignored << ", head permutation skipped " << ungrouped);
    CHECK(ignored > 0.5);
    CHECK(ungrouped > 0.5);
}
