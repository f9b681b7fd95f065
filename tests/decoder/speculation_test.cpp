// Speculative decoding: MTP and draft-model drafts, greedy and sampled verification, adaptive k,
// draft vocabularies (plugins/decoder/speculation).
#include "decoder/decoder_test.h"

// ---- speculative decoding ------------------------------------------------------------------------

TEST_CASE("speculate: drafts right up to every position: that many kept, the main model's next token after them, its state as a plain run's") {
    // Drafts taken from the plain greedy run and spoiled at position j: the step must keep
    // exactly j, return the plain run's next token, and leave the sequence (KV caches, Gated
    // DeltaNet state, the MTP block's cache) where a plain run would be.
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    const int64_t V = m->hparams().n_vocab;
    std::vector<std::vector<float>> want_logits;
    const auto truth = plain_greedy(*m, kSpecPrompt, 120, &want_logits);
    for (int k = 1; k <= 8; ++k) {
        CAPTURE(k);
        auto seq = m->new_sequence();
        Speculator spec(*m, *seq, k);
        auto first = spec.prefill(kSpecPrompt);
        REQUIRE(std::max_element(first.begin(), first.end()) - first.begin() == truth[0]);
        size_t at = 1;  // truth[at-1] is `last`
        int j = 0;
        double worst = 0;
        while (at + static_cast<size_t>(k) < truth.size()) {
            std::vector<int32_t> drafts(truth.begin() + static_cast<long>(at), truth.begin() + static_cast<long>(at) + k);
            if (j < k) drafts[static_cast<size_t>(j)] = (drafts[static_cast<size_t>(j)] + 1) % static_cast<int32_t>(V);
            const auto got = spec.verify(truth[at - 1], drafts);
            REQUIRE(got.size() == static_cast<size_t>(std::min(j, k)) + 1);
            for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == truth[at + i]);
            // The logits of each returned token are the plain run's for that position.
            for (size_t i = 0; i < got.size(); ++i)
                for (int64_t v = 0; v < V; ++v)
                    worst = std::max(worst, std::fabs(static_cast<double>(spec.logits()[i * static_cast<size_t>(V) + static_cast<size_t>(v)]) -
                                                      want_logits[at + i][static_cast<size_t>(v)]));
            at += got.size();
            CHECK(seq->n_past == static_cast<int64_t>(kSpecPrompt.size() + at - 1));
            CHECK(seq->mtp_n_past == seq->n_past + 1);  // and the next token, for the next first draft
            j = (j + 1) % (k + 1);
        }
        MESSAGE("k " << k << ": max |speculative - plain| logit " << worst);
        CHECK(worst < 2e-4);
        // The MTP block's cache was kept right through the rejections: its drafts now equal a
        // fresh speculator's that ran the same tokens as a prompt.
        std::vector<int32_t> all = kSpecPrompt;
        all.insert(all.end(), truth.begin(), truth.begin() + static_cast<long>(at) - 1);
        auto fresh_seq = m->new_sequence();
        Speculator fresh(*m, *fresh_seq, k);
        fresh.prefill(all);
        CHECK(spec.draft(truth[at - 1], k) == fresh.draft(truth[at - 1], k));
        CHECK(spec.draft(truth[at - 1], k) == fresh.draft(truth[at - 1], k));  // drafting leaves no trace
        const auto& st = spec.stats();
        CHECK(st.tokens == st.accepted + st.steps);
        CHECK(st.drafted == st.steps * k);
        CHECK(st.accepted_at[0] <= st.drafted_at[0]);
    }
}

TEST_CASE("speculate: several speculators drafting together (one MTP pass per draft position) draft what each drafts alone") {
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    const std::vector<std::vector<int32_t>> prompts = {kSpecPrompt, {5, 9, 200, 17, 33}, {101, 7, 7, 64, 250, 3, 12, 88}, {42, 43}};
    const std::vector<int> ks = {4, 1, 6, 0};  // different lengths, one not drafting
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<std::unique_ptr<Speculator>> owned;
    std::vector<Speculator*> specs;
    std::vector<int32_t> lasts;
    for (size_t i = 0; i < prompts.size(); ++i) {
        seqs.push_back(m->new_sequence());
        owned.push_back(std::make_unique<Speculator>(*m, *seqs.back(), 8));
        const auto logits = owned.back()->prefill(prompts[i]);
        lasts.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
        specs.push_back(owned.back().get());
    }
    for (int round = 0; round < 3; ++round) {  // and again after a verification step of each
        CAPTURE(round);
        const auto together = Speculator::draft_together(specs, lasts, ks);
        REQUIRE(together.size() == specs.size());
        for (size_t i = 0; i < specs.size(); ++i) {
            CAPTURE(i);
            CHECK(together[i].size() == static_cast<size_t>(ks[i]));
            CHECK(together[i] == specs[i]->draft(lasts[i], ks[i]));
            CHECK(seqs[i]->mtp_n_past == seqs[i]->n_past);
        }
        for (size_t i = 0; i < specs.size(); ++i) lasts[i] = specs[i]->verify(lasts[i], together[i]).back();
    }
    CHECK_THROWS_AS(Speculator::draft_together(specs, lasts, {1}), std::invalid_argument);
}

TEST_CASE("speculate: synthetic acceptance (benchmarking) keeps drafts at the rate asked, never an end token, and leaves the sequence consistent") {
    // The rate for a mean length: p + p^2 + ... + p^k = length - 1, as llama.cpp resolves it.
    for (double length : {1.0, 2.0, 3.0, 4.5, 5.0}) {
        const auto s = SyntheticAcceptance::for_length(length, 4);
        REQUIRE(s.keep.size() == 4);
        double sum = 0, term = 1;
        for (int j = 0; j < 4; ++j) sum += term *= s.keep[0];
        CHECK(sum == doctest::Approx(length - 1).epsilon(1e-9));
    }
    CHECK_THROWS_AS(SyntheticAcceptance::for_length(0.5, 4), std::invalid_argument);
    CHECK_THROWS_AS(SyntheticAcceptance::for_length(5.5, 4), std::invalid_argument);
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    const auto truth = plain_greedy(*m, kSpecPrompt, 1);
    for (double length : {1.0, 2.5, 5.0}) {
        CAPTURE(length);
        auto seq = m->new_sequence();
        Speculator spec(*m, *seq, 4);
        auto synthetic = SyntheticAcceptance::for_length(length, 4);
        spec.prefill(kSpecPrompt);
        int32_t last = truth[0];
        const int32_t never = spec.draft(last, 1)[0];  // the first draft: never kept
        synthetic.never = {never};
        spec.set_synthetic(synthetic);
        int64_t tokens = 0, kept_never = 0;
        for (int i = 0; i < 120; ++i) {
            const auto drafts = spec.draft(last, 4);
            const auto got = spec.step(last);
            REQUIRE(got.size() >= 1);
            // Kept drafts are the drafts themselves; the token after them is the main model's.
            for (size_t j = 0; j + 1 < got.size(); ++j) {
                CHECK(got[j] == drafts[j]);
                kept_never += got[j] == never;
            }
            tokens += static_cast<int64_t>(got.size());
            last = got.back();
            CHECK(seq->mtp_n_past == seq->n_past + 1);  // the block ran `last` too: the next step's first draft
            CHECK(seq->n_past == static_cast<int64_t>(kSpecPrompt.size()) + tokens);
        }
        CHECK(kept_never == 0);
        const double per_step = static_cast<double>(tokens) / 120;
        MESSAGE("length " << length << ": " << per_step << " tokens per step");
        if (length == 1.0) CHECK(per_step == 1.0);
        else CHECK(per_step == doctest::Approx(length).epsilon(0.2));  // the never token lowers it a little
    }
}

TEST_CASE("speculate: keeping a prefix of a tentative step leaves the states a run of only that prefix leaves, and nothing runs before it is settled") {
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    const std::vector<int32_t> head = {297, 72, 101, 108}, rows = {111, 44, 32, 119, 111};
    for (int64_t n = 1; n <= static_cast<int64_t>(rows.size()); ++n) {
        CAPTURE(n);
        auto plain = m->new_sequence();
        m->forward(*plain, head);
        const auto want = m->forward(*plain, std::vector<int32_t>(rows.begin(), rows.begin() + n));
        auto seq = m->new_sequence();
        m->forward(*seq, head);
        Segment all{seq.get(), rows.data(), static_cast<int64_t>(rows.size())};
        all.tentative = true;
        m->step({all});
        CHECK(seq->n_past == static_cast<int64_t>(head.size() + rows.size()));
        // Unsettled: no step, no copy; a keep of more rows than ran, or none, refused.
        CHECK_THROWS_WITH_AS(m->forward(*seq, {5}), doctest::Contains("not settled"), std::logic_error);
        CHECK_THROWS_WITH_AS(Sequence{*seq}, doctest::Contains("tentative step not yet settled"), std::logic_error);
        CHECK_THROWS_WITH_AS(m->keep_tentative(*seq, 6), doctest::Contains("ran 5 rows, not 6"), std::logic_error);
        CHECK_THROWS_WITH_AS(m->keep_tentative(*seq, 0), doctest::Contains("ran 5 rows, not 0"), std::logic_error);
        m->keep_tentative(*seq, n);
        CHECK(seq->n_past == static_cast<int64_t>(head.size()) + n);
        // The next token's logits read every state: the plain run's (within rounding: a row's
        // layer outputs in a step of 5 rows may round differently from a step of n).
        const auto got = m->forward(*seq, {5}), plain_next = m->forward(*plain, {5});
        double worst = 0;
        for (size_t v = 0; v < got.size(); ++v) worst = std::max(worst, std::fabs(static_cast<double>(got[v]) - plain_next[v]));
        CHECK(worst < 1e-4);
        CHECK(want.size() == static_cast<size_t>(m->hparams().n_vocab));
        CHECK_THROWS_WITH_AS(m->keep_tentative(*seq, 1), doctest::Contains("no tentative step"), std::logic_error);
    }
}

TEST_CASE("speculate: with the MTP block's own drafts the output is plain greedy decoding, token for token, for k = 1..8") {
    TempDir d;
    for (uint32_t type : {kF32, kQ8_0}) {
        write_synthetic(d / "mtp.gguf", spec_shape(), type, 9);
        auto m = Model::load(GgufFile::open(d / "mtp.gguf"));
        m->exact = true;
        const auto truth = plain_greedy(*m, kSpecPrompt, 96);
        for (int k = 1; k <= 8; ++k) {
            CAPTURE(type_name(type));
            CAPTURE(k);
            auto seq = m->new_sequence();
            Speculator spec(*m, *seq, k);
            CHECK(speculative_greedy(spec, truth.size()) == truth);
            CHECK(std::set<int32_t>(truth.begin(), truth.end()).size() > 10);  // text, not one token repeated
            const auto& st = spec.stats();
            CHECK(st.tokens == st.accepted + st.steps);
            CHECK(st.accepted <= st.drafted);
        }
    }
}

TEST_CASE("speculate: on the int8 path, at every kernel level, speculative greedy output is plain greedy's; on aarch64 every level decodes the same tokens") {
    // The default path (int8 activations) with each level forced: a verification's k + 1 rows
    // (the several-token kernels: i8mm on aarch64) must give each row's one-token result
    // exactly, or speculative greedy decoding drifts from plain greedy. On aarch64 every level
    // computes the same bits (i8_dot_reference), so every level's greedy tokens are the
    // portable level's too.
    TempDir d;
    write_synthetic(d / "mtp.gguf", spec_shape(), kQ8_0, 9);
    std::vector<int32_t> portable;
    for (const std::string& level : kernel_levels()) {
        CAPTURE(level);
        limit_kernels(level.c_str());
        auto m = Model::load(GgufFile::open(d / "mtp.gguf"));
        REQUIRE_FALSE(m->exact);
        const auto truth = plain_greedy(*m, kSpecPrompt, 48);
        CHECK(std::set<int32_t>(truth.begin(), truth.end()).size() > 8);  // text, not one token repeated
        for (int k : {1, 4}) {
            CAPTURE(k);
            auto seq = m->new_sequence();
            Speculator spec(*m, *seq, k);
            CHECK(speculative_greedy(spec, truth.size()) == truth);
        }
        if (portable.empty()) portable = truth;
#if defined(__aarch64__)
        CHECK(truth == portable);
#endif
    }
    limit_kernels("");
}

TEST_CASE("speculate: sampled drafts are kept so that every position keeps the main model's distribution (with and without top-k, top-p)") {
    // Three rows of logits over six tokens; drafts 2 then 4. Position by position the tokens
    // returned must be distributed as the sampler's distribution of that row: the first always,
    // the second among runs that kept the first draft, the third among runs that kept both.
    const int64_t V = 6;
    const std::vector<float> logits = {0.1f, 0.5f, 1.4f, -0.3f, 0.9f, 0.0f,   // row 0: after `last`
                                       0.2f, -1.0f, 0.3f, 0.1f, 1.3f, 0.6f,   // row 1: after draft 2
                                       1.0f, 0.9f, 0.8f, -0.5f, 0.0f, 0.4f};  // row 2: after draft 4
    const std::vector<int32_t> drafts = {2, 4};
    for (const SamplerParams& sp : {SamplerParams{1.0, 0, 1, 0, 11}, SamplerParams{0.8, 4, 0.9, 0, 12}}) {
        CAPTURE(sp.top_k);
        Sampler sampler(sp);
        std::vector<Sampler::Distribution> p;
        for (int r = 0; r < 3; ++r) p.push_back(sampler.distribution(logits.data() + r * V, V));
        const int N = 40000;
        std::vector<std::vector<double>> seen(3, std::vector<double>(static_cast<size_t>(V), 0));
        std::vector<double> runs(3, 0);
        for (int n = 0; n < N; ++n) {
            const auto out = accept_drafts(logits.data(), V, drafts, sampler);
            REQUIRE((!out.empty() && out.size() <= 3));
            for (size_t i = 0; i < out.size(); ++i) {
                ++runs[i];
                ++seen[i][static_cast<size_t>(out[i])];
                if (i < drafts.size() && out[i] != drafts[i]) REQUIRE(i + 1 == out.size());  // a rejection ends the step
            }
        }
        for (size_t i = 0; i < 3; ++i) {
            double worst = 0;
            for (int32_t x = 0; x < V; ++x) worst = std::max(worst, std::fabs(seen[i][static_cast<size_t>(x)] / runs[i] - p[i].probability(x)));
            MESSAGE("position " << i << ": " << runs[i] << " runs, max |frequency - probability| " << worst);
            CHECK(runs[i] > 3000);
            CHECK(worst < (i == 0 ? 0.015 : 0.03));
        }
        // How often a draft is kept is its probability.
        CHECK(std::fabs(runs[1] / N - p[0].probability(2)) < 0.015);
    }
    // Greedy: the argmax decides.
    Sampler greedy(SamplerParams{});
    CHECK(accept_drafts(logits.data(), V, {2, 4}, greedy) == std::vector<int32_t>{2, 4, 0});
    CHECK(accept_drafts(logits.data(), V, {2, 5}, greedy) == std::vector<int32_t>{2, 4});
    CHECK(accept_drafts(logits.data(), V, {1, 4}, greedy) == std::vector<int32_t>{2});
}

TEST_CASE("speculate: a sampled run drafts, keeps some drafts of a block that agrees, and stays consistent") {
    TempDir d;
    write_synthetic(d / "mtp.gguf", mtp_shape(), kF32, 7);
    auto m = Model::load(GgufFile::open(d / "mtp.gguf"));
    auto seq = m->new_sequence();
    Speculator spec(*m, *seq, 3, SamplerParams{0.9, 0, 1, 0, 5});
    const auto l = spec.prefill(kSpecPrompt);
    std::vector<int32_t> out{spec.sample(l)};
    for (int guard = 0; out.size() < 64 && guard < 100; ++guard) {
        const auto got = spec.step(out.back());
        REQUIRE((!got.empty() && got.size() <= 4));
        out.insert(out.end(), got.begin(), got.end());
    }
    const auto& st = spec.stats();
    CHECK(st.tokens == st.accepted + st.steps);
    CHECK(seq->n_past == static_cast<int64_t>(kSpecPrompt.size() + out.size() - 1));
    CHECK(seq->mtp_n_past == seq->n_past + 1);
}

TEST_CASE("speculate: adaptive k drafts as far as the running acceptance makes worth it, and stops drafting a head that is never right") {
    // drafts_worth: draft i while the chance that drafts 0..i are all kept is at least 0.3.
    CHECK(drafts_worth({0.9, 0.9, 0.9, 0.9}, 4) == 4);
    CHECK(drafts_worth({0.9, 0.9, 0.9, 0.9}, 2) == 2);
    CHECK(drafts_worth({0.8, 0.6, 0.5, 0.9}, 4) == 2);  // 0.8, 0.48, then 0.24
    CHECK(drafts_worth({0.2, 1.0}, 4) == 0);
    CHECK(drafts_worth({}, 4) == 0);
    // A random block: after a few rejected steps no more drafting, but a probe every 16 steps;
    // the output stays plain greedy decoding's.
    TempDir d;
    auto m = exact_mtp_model(d, 9);
    const auto truth = plain_greedy(*m, kSpecPrompt, 80);
    auto seq = m->new_sequence();
    Speculator spec(*m, *seq, 6, SamplerParams{}, true);
    CHECK(spec.next_k() == 3);  // a new head is trusted with three drafts
    auto l = spec.prefill(kSpecPrompt);
    std::vector<int32_t> out{spec.sample(l)};
    // How soon it stops depends on what drafts cost here (the threshold is measured: DraftCosts),
    // never later than the cheapest draft (worth 0.05) allows: the rate of the first draft falls
    // by 7/8 a rejection from 0.7, below 0.05 after 20.
    int64_t drafted_late = 0;
    for (int guard = 0; out.size() < truth.size() && guard < 200; ++guard) {
        const int64_t before = spec.stats().drafted;
        auto got = spec.step(out.back());
        out.insert(out.end(), got.begin(), got.end());
        if (out.size() > truth.size() - 32) drafted_late += spec.stats().drafted - before;
    }
    out.resize(truth.size());
    CHECK(out == truth);
    const auto& st = spec.stats();
    MESSAGE("adaptive over " << st.steps << " steps: " << st.plain_steps << " without drafts, " << st.drafted << " drafted, " << st.accepted
                             << " kept; threshold " << spec.worth());
    CHECK(st.accepted == 0);         // the random block is never right on this file
    CHECK(st.plain_steps > st.steps / 2);
    CHECK(drafted_late <= 2);        // the last 32 steps: no drafts but a probe every 16
    CHECK(st.drafted_at[0] > 1);     // probes went on
}

TEST_CASE("speculate: DraftCosts measures what a draft costs from steps of different lengths, and adaptive k's threshold follows it") {
    // Steps of 10 ms plus c ms per draft, each decoding 1 + drafts/2 tokens: worth = c / τ.
    auto feed = [](DraftCosts& costs, double base, double per_draft, int steps, const std::vector<int>& cycle) {
        for (int i = 0; i < steps; ++i) {
            const int d = cycle[static_cast<size_t>(i) % cycle.size()];
            costs.observe(d, 1 + d / 2, (base + per_draft * d) * 1e-3);
        }
    };
    SUBCASE("the same number of drafts every step: nothing to fit, the prior holds") {
        DraftCosts costs;
        feed(costs, 10, 2, 100, {4});
        CHECK(costs.worth() == DraftCosts::kPriorWorth);
        CHECK(costs.seconds_per_draft() == 0);
    }
    SUBCASE("k varied now and then, as the speculator does: the slope, and worth = c / τ") {
        DraftCosts costs;
        // Seven steps too few to fit, whatever they show.
        feed(costs, 10, 2.5, 7, {3, 4, 5});
        CHECK(costs.worth() == DraftCosts::kPriorWorth);
        feed(costs, 10, 2.5, 200, {4, 4, 4, 4, 4, 4, 3, 4, 4, 4, 4, 4, 4, 4, 5, 4});
        CHECK(costs.seconds_per_draft() == doctest::Approx(2.5e-3).epsilon(1e-6));
        CHECK(costs.worth() == doctest::Approx(2.5e-3 / costs.seconds_per_token()).epsilon(1e-9));
        CHECK(costs.seconds_per_token() == doctest::Approx(20e-3 / 3).epsilon(0.02));  // mostly 20 ms for 3 tokens
        // A draft costing over a third of a token's time: drafts_worth then stops where the
        // chance falls below it (0.7^3 = 0.343), earlier than the prior's 0.3 would.
        CHECK(drafts_worth({0.7, 0.7, 0.7, 0.7}, 4, DraftCosts::kPriorWorth) == 3);
        CHECK(costs.worth() > 0.35);
        CHECK(drafts_worth({0.7, 0.7, 0.7, 0.7}, 4, costs.worth()) == 2);
    }
    SUBCASE("the older steps fade: a change in costs is followed") {
        DraftCosts costs;
        feed(costs, 10, 2, 300, {4, 3, 4, 5});
        feed(costs, 10, 6, 600, {4, 3, 4, 5});
        CHECK(costs.seconds_per_draft() == doctest::Approx(6e-3).epsilon(0.01));
    }
    SUBCASE("bounds: free or negative slopes do not make every draft look free; bad samples are ignored") {
        DraftCosts costs;
        feed(costs, 30, -3, 100, {2, 3, 4});  // longer steps with fewer drafts (noise)
        CHECK(costs.seconds_per_draft() == 0);
        CHECK(costs.worth() == doctest::Approx(0.05));
        DraftCosts dear;
        feed(dear, 1, 50, 100, {0, 1});
        CHECK(dear.worth() == 1.0);  // nothing is ever that likely: no drafts but the probes
        const double before = dear.seconds_per_token();
        dear.observe(1, 0, 1.0);   // no token decoded
        dear.observe(1, 1, 0.0);   // no time
        dear.observe(1, 1, -1.0);
        CHECK(dear.seconds_per_token() == before);
    }
}

TEST_CASE("speculate: adaptive k varies its drafts now and then, and fits their cost from its own steps") {
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    const auto truth = plain_greedy(*m, kSpecPrompt, 1);
    auto seq = m->new_sequence();
    Speculator spec(*m, *seq, 4, SamplerParams{}, true);
    spec.set_worth(0.05);  // every kept-enough draft worth it: k at its ceiling unless varied
    spec.prefill(kSpecPrompt);
    spec.set_synthetic(SyntheticAcceptance::for_length(5.0, 4));  // every draft kept
    int32_t last = truth[0];
    std::map<int64_t, int> drafts_seen;
    for (int i = 0; i < 64; ++i) {
        const int64_t before = spec.stats().drafted;
        spec.set_worth(0.05);
        last = spec.step(last).back();
        ++drafts_seen[spec.stats().drafted - before];
    }
    // At the ceiling (4) a step in 16 takes one fewer; one more is past the ceiling.
    CHECK(drafts_seen[4] == 60);
    CHECK(drafts_seen[3] == 4);
    CHECK(drafts_seen.size() == 2);
    // step() measured its own steps: a fitted threshold (not the prior) in [0.05, 1].
    CHECK(spec.costs().worth() != DraftCosts::kPriorWorth);
    CHECK(spec.costs().seconds_per_token() > 0);
}

TEST_CASE("speculate: bad arguments are refused by name") {
    TempDir d;
    write_synthetic(d / "plain.gguf", tiny_shape(), kF32, 7);
    auto m = Model::load(GgufFile::open(d / "plain.gguf"));
    auto seq = m->new_sequence();
    CHECK_THROWS_WITH_AS(Speculator(*m, *seq, 0), doctest::Contains("drafts per step must be 1 to 16"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Speculator(*m, *seq, 17), doctest::Contains("drafts per step must be 1 to 16"), std::invalid_argument);
    Speculator spec(*m, *seq, 4);
    CHECK_THROWS_WITH_AS(spec.prefill({}), doctest::Contains("prompt is empty"), std::invalid_argument);
    spec.prefill({1, 2, 3});
    CHECK_THROWS_WITH_AS(spec.step(5), doctest::Contains("needs the model's MTP block"), std::logic_error);
    // Without a block, verify still takes drafts from elsewhere (a draft model).
    CHECK(spec.verify(5, {6, 7}).size() >= 1);
    CHECK_THROWS_WITH_AS(Speculator(*m, *seq, 4), doctest::Contains("fresh sequence"), std::invalid_argument);
}

TEST_CASE("speculate: a draft model of the same vocabulary drafts through the same verify path: plain greedy output, k = 1..8") {
    // Drafters: the model itself (every draft kept), its first layer alone (same seed: right
    // about 5 times in 6, so kept and rejected drafts mix), and a model of another seed
    // (nearly always wrong).
    TempDir d;
    auto m = exact_mtp_model(d, 9);
    write_first_layer(d / "short.gguf", 9);
    write_synthetic(d / "other.gguf", spec_shape(), kF32, 4);
    const auto truth = plain_greedy(*m, kSpecPrompt, 80);
    for (const char* name : {"mtp.gguf", "short.gguf", "other.gguf"}) {
        auto dm = Model::load(GgufFile::open(d / name));
        dm->exact = true;
        for (int k = 1; k <= 8; ++k) {
            CAPTURE(name);
            CAPTURE(k);
            auto seq = m->new_sequence();
            Speculator spec(*m, *seq, k, SamplerParams{}, false, DraftSource{dm.get()});
            CHECK(speculative_greedy(spec, truth.size()) == truth);
            const auto& st = spec.stats();
            CHECK(st.drafted == st.steps * k);
            CHECK(seq->mtp_n_past == 0);  // a draft model leaves the MTP block unused
            if (std::string(name) == "mtp.gguf") CHECK(st.accepted == st.drafted);
            if (std::string(name) == "short.gguf" && k == 4) {
                CHECK(st.accepted > st.drafted / 2);
                CHECK(st.recomputed_rows > 0);  // and some were rejected
            }
            if (k == 4) MESSAGE(std::string(name) << " k 4: " << st.accepted << " of " << st.drafted << " drafts kept");
        }
    }
    // A long prompt runs through the draft model a full step at a time during the prefill, not
    // all at the first draft (which would stall that step): what is left behind is less than a
    // step, and decoding on from there is still plain greedy.
    {
        auto dm = Model::load(GgufFile::open(d / "short.gguf"));
        dm->exact = true;
        std::vector<int32_t> prompt;
        for (int i = 0; i < 150; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
        auto seq = m->new_sequence();
        Speculator spec(*m, *seq, 4, SamplerParams{}, false, DraftSource{dm.get()});
        const auto l = spec.prefill(prompt);
        const auto c = spec.carry();
        CHECK(c.draft_seq->n_past == 128);
        CHECK(c.draft_behind.size() == 22);
        std::vector<int32_t> out{static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())};
        for (int guard = 0; out.size() < 24 && guard < 100; ++guard) {
            const auto got = spec.step(out.back());
            out.insert(out.end(), got.begin(), got.end());
        }
        out.resize(24);
        CHECK(out == plain_greedy(*m, prompt, 24));
        CHECK(spec.stats().accepted > 0);
    }
    // A draft model of another vocabulary is refused by name.
    SynthVocab small = synthetic_vocab();
    small.tokens.resize(small.tokens.size() - 1);
    small.types.resize(small.tokens.size());
    SynthShape shape = spec_shape();
    shape.vocab = &small;
    write_synthetic(d / "small.gguf", shape, kF32, 3);
    auto dm = Model::load(GgufFile::open(d / "small.gguf"));
    auto seq = m->new_sequence();
    CHECK_THROWS_WITH_AS(Speculator(*m, *seq, 4, SamplerParams{}, false, DraftSource{dm.get()}), doctest::Contains("same vocabulary"),
                         std::invalid_argument);
}

TEST_CASE("speculate: a speculator resumed from a checkpoint (a sequence copy and its carry) drafts and decodes as the original goes on") {
    TempDir d;
    auto m = exact_mtp_model(d, 9);
    write_first_layer(d / "short.gguf", 9);
    auto dm = Model::load(GgufFile::open(d / "short.gguf"));
    dm->exact = true;
    for (const Model* source : {static_cast<const Model*>(nullptr), static_cast<const Model*>(dm.get())}) {
        CAPTURE(source != nullptr);
        auto seq = m->new_sequence();
        Speculator spec(*m, *seq, 3, SamplerParams{}, false, DraftSource{source});
        auto l = spec.prefill(kSpecPrompt);
        int32_t last = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
        for (int i = 0; i < 3; ++i) last = spec.step(last).back();
        Sequence copy = *seq;
        const auto carry = spec.carry();
        Speculator resumed(*m, copy, 3, SamplerParams{}, false, DraftSource{source}, &carry);
        int32_t a = last, b = last;
        for (int i = 0; i < 6; ++i) {
            CHECK(spec.draft(a, 3) == resumed.draft(b, 3));
            a = spec.step(a).back();
            b = resumed.step(b).back();
            CHECK(a == b);
        }
        CHECK(copy.n_past == seq->n_past);
        // A checkpoint without the state its source needs is refused.
        Speculator::Carry empty;
        CHECK_THROWS_AS(Speculator(*m, copy, 3, SamplerParams{}, false, DraftSource{source}, &empty), std::invalid_argument);
    }
}

TEST_CASE("speculate: the draft setting parses off, mtp and model:PATH, and names what it takes otherwise") {
    CHECK(DraftSetting::parse("off").kind == DraftSetting::off);
    CHECK(DraftSetting::parse("mtp").kind == DraftSetting::mtp);
    const auto m = DraftSetting::parse("model:/models/small.gguf");
    CHECK(m.kind == DraftSetting::model);
    CHECK(m.path == "/models/small.gguf");
    for (const char* bad : {"", "on", "model:", "MTP", "eagle"})
        CHECK_THROWS_WITH_AS(DraftSetting::parse(bad), doctest::Contains("\"off\", \"mtp\""), std::invalid_argument);
}

TEST_CASE("speculate: with a draft vocabulary the block's logits are the full head's for the listed tokens, drafts come from the list, greedy output is unchanged") {
    TempDir d;
    for (uint32_t type : {kF32, kQ8_0}) {
        CAPTURE(type_name(type));
        write_synthetic(d / "mtp.gguf", spec_shape(), type, 9);
        auto full = Model::load(GgufFile::open(d / "mtp.gguf")), narrow = Model::load(GgufFile::open(d / "mtp.gguf"));
        full->exact = narrow->exact = type == kF32;
        const int64_t V = full->hparams().n_vocab, E = full->hparams().n_embd;
        // 101 tokens (not whole groups of eight rows), out of order: every third id from the top.
        std::vector<int32_t> ids;
        for (int32_t t = static_cast<int32_t>(V) - 1; t >= 0 && ids.size() < 101; t -= 3) ids.push_back(t);
        narrow->set_draft_vocab(ids);
        CHECK(narrow->mtp_vocab() == 101);
        CHECK(full->mtp_vocab() == V);
        for (int64_t c = 0; c < 101; ++c) CHECK(narrow->mtp_token(c) == ids[static_cast<size_t>(c)]);
        // One block row on each, the same token and hidden state in.
        std::vector<float> h(static_cast<size_t>(E));
        for (int64_t i = 0; i < E; ++i) h[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
        const int32_t tok = 77;
        std::vector<float> lf(static_cast<size_t>(V)), ln(101), hf(static_cast<size_t>(E)), hn(static_cast<size_t>(E));
        auto sf = full->new_sequence(), sn = narrow->new_sequence();
        full->mtp_step({Segment{sf.get(), &tok, 1, lf.data(), false, hf.data(), h.data()}});
        narrow->mtp_step({Segment{sn.get(), &tok, 1, ln.data(), false, hn.data(), h.data()}});
        CHECK(hn == hf);
        double worst = 0;
        for (size_t c = 0; c < ids.size(); ++c) worst = std::max(worst, std::fabs(static_cast<double>(ln[c]) - lf[static_cast<size_t>(ids[c])]));
        CHECK(worst <= (type == kF32 ? 0.0 : 1e-4));
        // Speculation: every draft is a listed token, and the text is plain greedy's.
        const auto truth = plain_greedy(*full, kSpecPrompt, 64);
        for (int k : {1, 4}) {
            CAPTURE(k);
            auto seq = narrow->new_sequence();
            Speculator spec(*narrow, *seq, k);
            auto l = spec.prefill(kSpecPrompt);
            std::vector<int32_t> out{static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())};
            for (int guard = 0; out.size() < truth.size() && guard < 200; ++guard) {
                for (const int32_t t : spec.draft(out.back(), k)) CHECK(std::find(ids.begin(), ids.end(), t) != ids.end());
                const auto got = spec.step(out.back());
                out.insert(out.end(), got.begin(), got.end());
            }
            out.resize(truth.size());
            CHECK(out == truth);
            CHECK(spec.stats().drafted > 0);
        }
    }
}

TEST_CASE("speculate: a draft vocabulary is refused by name: out of range, listed twice, empty, set twice, no MTP block") {
    TempDir d;
    auto m = exact_mtp_model(d, 7);
    const int32_t V = static_cast<int32_t>(m->hparams().n_vocab);
    CHECK_THROWS_WITH_AS(m->set_draft_vocab({1, V}), doctest::Contains(("token " + std::to_string(V) + " is outside the vocabulary").c_str()), std::invalid_argument);
    CHECK_THROWS_WITH_AS(m->set_draft_vocab({-1}), doctest::Contains("token -1 is outside"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(m->set_draft_vocab({5, 6, 5}), doctest::Contains("token 5 is listed twice"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(m->set_draft_vocab({}), doctest::Contains("no token"), std::invalid_argument);
    CHECK(m->mtp_vocab() == V);  // nothing set by a refused list
    m->set_draft_vocab({3, 4});
    CHECK_THROWS_WITH_AS(m->set_draft_vocab({3, 4}), doctest::Contains("set once"), std::logic_error);
    write_synthetic(d / "plain.gguf", tiny_shape(), kF32, 7);
    auto plain = Model::load(GgufFile::open(d / "plain.gguf"));
    CHECK_THROWS_WITH_AS(plain->set_draft_vocab({1}), doctest::Contains("needs the model's MTP block"), std::logic_error);
}

TEST_CASE("speculate: a draft vocabulary file: ids one a line, counts and comments ignored; a bad line is named with its number") {
    TempDir d;
    auto write = [&](const std::string& text) {
        std::ofstream(d / "v.txt") << text;
        return (d / "v.txt").string();
    };
    CHECK(read_draft_vocab(write("# draft vocabulary\n12 900\n\n7 40  # a comment\n  300\n"), 305) == std::vector<int32_t>{12, 7, 300});
    const std::string p = (d / "v.txt").string();
    CHECK_THROWS_WITH_AS(read_draft_vocab(write("12\n7x 3\n"), 305), doctest::Contains((p + ":2: '7x' is not a token id").c_str()), std::invalid_argument);
    CHECK_THROWS_WITH_AS(read_draft_vocab(write("12\n305\n"), 305), doctest::Contains((p + ":2: token 305 is outside the model's vocabulary (0..304)").c_str()),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(read_draft_vocab(write("-3\n"), 305), doctest::Contains(":1: token -3 is outside"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(read_draft_vocab(write("12\n# x\n12\n"), 305), doctest::Contains((p + ":3: token 12 is listed twice (first on line 1)").c_str()),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(read_draft_vocab(write("# nothing\n\n"), 305), doctest::Contains("lists no token"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(read_draft_vocab((d / "missing.txt").string(), 305), doctest::Contains("cannot read"), std::invalid_argument);
    // first:N, no file: the first N ids.
    CHECK(read_draft_vocab("first:3", 305) == std::vector<int32_t>{0, 1, 2});
    CHECK(read_draft_vocab("first:305", 305).size() == 305);
    for (const char* bad : {"first:0", "first:306", "first:", "first:3x", "first:-1"})
        CHECK_THROWS_WITH_AS(read_draft_vocab(bad, 305), doctest::Contains("first:N takes N from 1 to the model's 305 tokens"), std::invalid_argument);
}
