// Self-distillation data and draft vocabularies (plugins/decoder/tools).
#include "decoder/decoder_test.h"

// ---- self-distillation data ---------------------------------------------------------------------

namespace {
// A .npy file read back: its header's dtype and shape, and the raw data after the header.
struct Npy {
    std::string descr;
    std::vector<int64_t> shape;
    std::string data;
};
Npy read_npy(const fs::path& p) {
    const std::string bytes = pulse::test::read_file(p);
    REQUIRE(bytes.size() >= 10);
    REQUIRE(bytes.compare(0, 6, "\x93NUMPY") == 0);
    const size_t len = static_cast<unsigned char>(bytes[8]) | static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8;
    REQUIRE((10 + len) % 64 == 0);
    const std::string header = bytes.substr(10, len);
    std::smatch m;
    REQUIRE(std::regex_search(header, m, std::regex(R"('descr': '([<>|a-z0-9]+)', 'fortran_order': False, 'shape': \(([0-9, ]*)\))")));
    Npy n{m[1], {}, bytes.substr(10 + len)};
    std::stringstream dims(m[2].str());
    for (std::string d; std::getline(dims, d, ',');)
        if (d.find_first_not_of(' ') != std::string::npos) n.shape.push_back(std::stoll(d));
    return n;
}
template <class T>
std::vector<T> values(const Npy& n) {
    std::vector<T> v(n.data.size() / sizeof(T));
    std::memcpy(v.data(), n.data.data(), v.size() * sizeof(T));
    return v;
}
}  // namespace

TEST_CASE("distill: collected data are the model's own continuations and its hidden state at every row, as NumPy files") {
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    const int64_t E = m->hparams().n_embd;
    const std::vector<std::vector<int32_t>> prompts = {kSpecPrompt, std::vector<int32_t>(70, 101)};  // the second takes two prefill steps
    CollectOptions o;
    o.max_new = 10;
    const auto sum = collect_hidden(*m, "mtp.gguf", prompts, {}, o, d / "data");
    CHECK(sum.sequences == 2);
    CHECK(sum.generated == 20);
    // The two prompts packed: 64 rows, then the rest of the second (one at a time: 1 + 2 steps).
    REQUIRE(kSpecPrompt.size() + 70 <= 128);
    CHECK(sum.prompt_steps == 2);
    CHECK(sum.generation_steps == 10);
    CHECK(sum.tokens == static_cast<int64_t>(kSpecPrompt.size() + 70 + 20));
    const auto tokens = read_npy(d / "data/tokens.npy"), hidden = read_npy(d / "data/hidden.npy"), starts = read_npy(d / "data/starts.npy"),
               gen = read_npy(d / "data/generated_from.npy");
    CHECK(tokens.descr == "<i4");
    CHECK(hidden.descr == "<f4");
    CHECK(starts.descr == "<i8");
    CHECK(tokens.shape == std::vector<int64_t>{sum.tokens});
    CHECK(hidden.shape == std::vector<int64_t>{sum.tokens, E});
    CHECK(values<int64_t>(starts) == std::vector<int64_t>{0, static_cast<int64_t>(kSpecPrompt.size()) + 10, sum.tokens});
    CHECK(values<int64_t>(gen) == std::vector<int64_t>{static_cast<int64_t>(kSpecPrompt.size()), static_cast<int64_t>(kSpecPrompt.size()) + 10 + 70});
    // Sequence 0: the prompt, then plain greedy decoding's tokens.
    const auto t = values<int32_t>(tokens);
    std::vector<int32_t> first(t.begin(), t.begin() + static_cast<long>(kSpecPrompt.size()) + 10);
    std::vector<int32_t> want = kSpecPrompt;
    const auto greedy = plain_greedy(*m, kSpecPrompt, 10);
    want.insert(want.end(), greedy.begin(), greedy.end());
    CHECK(first == want);
    // Its hidden rows: what one step over all of its tokens gives.
    auto seq = m->new_sequence();
    std::vector<float> rows(first.size() * static_cast<size_t>(E));
    m->step({Segment{seq.get(), first.data(), static_cast<int64_t>(first.size()), nullptr, false, rows.data()}});
    const auto h = values<float>(hidden);
    double worst = 0;
    for (size_t i = 0; i < rows.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(rows[i]) - h[i]));
    CHECK(worst < 2e-4);
    // Generated one sequence at a time instead of in one batch: the same tokens and rows.
    CollectOptions one = o;
    one.batch = 1;
    const auto one_sum = collect_hidden(*m, "mtp.gguf", prompts, {}, one, d / "one");
    CHECK(one_sum.prompt_steps == 3);
    CHECK(one_sum.generation_steps == 20);
    CHECK(values<int32_t>(read_npy(d / "one/tokens.npy")) == t);
    const auto h1 = values<float>(read_npy(d / "one/hidden.npy"));
    REQUIRE(h1.size() == h.size());
    double apart = 0;
    for (size_t i = 0; i < h.size(); ++i) apart = std::max(apart, std::fabs(static_cast<double>(h1[i]) - h[i]));
    CHECK(apart < 2e-4);
    // An end-of-generation token ends a sequence early; the meta file describes the layout.
    const auto ended = collect_hidden(*m, "mtp.gguf", {kSpecPrompt}, {greedy[2]}, o, d / "ended");
    CHECK(ended.generated == std::find(greedy.begin(), greedy.end(), greedy[2]) - greedy.begin() + 1);  // through its first appearance
    const std::string meta = pulse::test::read_file(d / "data/meta.json");
    CHECK(meta.find(R"("format":"pulse self-distillation data 1")") != std::string::npos);
    CHECK(meta.find(R"("n_embd":)" + std::to_string(E)) != std::string::npos);
    CHECK_THROWS_AS(collect_hidden(*m, "x", prompts, {}, o, "/proc/no/such/dir"), std::exception);
}

TEST_CASE("distill: a draft vocabulary counts the generated tokens only and ranks them most frequent first, ties by id") {
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    CollectOptions o;
    o.max_new = 12;
    const std::vector<std::vector<int32_t>> prompts = {kSpecPrompt, {5, 9, 200, 17, 33}};
    collect_hidden(*m, "mtp.gguf", prompts, {}, o, d / "data");
    std::vector<int64_t> counts(static_cast<size_t>(m->hparams().n_vocab)), want(counts.size());
    count_generated(d / "data", counts);
    for (const auto& p : prompts)
        for (const int32_t t : plain_greedy(*m, p, 12)) ++want[static_cast<size_t>(t)];
    CHECK(counts == want);
    // Two directories add up.
    count_generated(d / "data", counts);
    for (auto& c : want) c *= 2;
    CHECK(counts == want);
    CHECK(rank_tokens({0, 3, 1, 3, 0, 7}, 0) == std::vector<int32_t>{5, 1, 3, 2});
    CHECK(rank_tokens({0, 3, 1, 3, 0, 7}, 2) == std::vector<int32_t>{5, 1});
    CHECK(rank_tokens({0, 0}, 5).empty());
    std::vector<int64_t> small(10);
    CHECK_THROWS_WITH_AS(count_generated(d / "data", small), doctest::Contains("outside the model's vocabulary of 10"), std::runtime_error);
    CHECK_THROWS_WITH_AS(count_generated(d / "nowhere", counts), doctest::Contains("cannot read"), std::runtime_error);
}
