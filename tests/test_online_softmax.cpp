// tests/test_online_softmax.cpp — the rule of common/online_softmax.hpp against a direct softmax.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "catch.hpp"
#include "common/online_softmax.hpp"
#include "common/problem.hpp"

using namespace flashattn;

namespace {

// Softmax state of one block, computed directly: m = max, l = sum exp(x - m).
SoftmaxState block_state(const std::vector<float>& x, std::size_t begin, std::size_t end) {
    float m = -INFINITY;
    for (std::size_t k = begin; k < end; ++k) m = nan_max(m, x[k]);
    float l = 0;
    for (std::size_t k = begin; k < end; ++k) l += exp_shifted(x[k], m);
    return {m, l};
}

}  // namespace

TEST_CASE("merging a row's blocks in any split and order gives the softmax of the whole row") {
    std::mt19937 gen(Catch::rngSeed() + 17);
    for (int trial = 0; trial < 200; ++trial) {
        const std::size_t n = 1 + gen() % 300;
        std::normal_distribution<float> dist(0.0f, 1.0f + trial % 7 * 10.0f);  // up to |x| ~ 200
        std::vector<float> x(n);
        for (float& v : x) v = dist(gen);

        // Independent reference in double: log-sum-exp and softmax of the whole row.
        double m_ref = -INFINITY;
        for (float v : x) m_ref = std::max(m_ref, double(v));
        double l_ref = 0;
        for (float v : x) l_ref += std::exp(double(v) - m_ref);
        const double lse_ref = m_ref + std::log(l_ref);

        // Random split points, blocks merged in a random order.
        std::vector<std::size_t> cuts = {0, n};
        for (int c = 0; c < int(gen() % 6); ++c) cuts.push_back(gen() % (n + 1));
        std::sort(cuts.begin(), cuts.end());
        std::vector<std::pair<std::size_t, std::size_t>> blocks;
        for (std::size_t c = 0; c + 1 < cuts.size(); ++c)
            if (cuts[c] < cuts[c + 1]) blocks.push_back({cuts[c], cuts[c + 1]});
        std::shuffle(blocks.begin(), blocks.end(), gen);

        SoftmaxState running;  // empty: m = -inf, l = 0
        for (auto [b, e] : blocks) {
            const SoftmaxMerge r = merge_softmax(running, block_state(x, b, e));
            running = {r.m_new, r.l_new};
        }
        INFO("n=" << n << " blocks=" << blocks.size() << " trial=" << trial);
        CHECK(running.m == Approx(m_ref).epsilon(0));
        CHECK(log_sum_exp(running) == Approx(lse_ref).epsilon(1e-5).margin(1e-5));
        // Each softmax entry from the merged state: exp(x_k - m) / l.
        for (std::size_t k = 0; k < n; ++k) {
            const double p = exp_shifted(x[k], running.m) / running.l;
            CHECK(p == Approx(std::exp(double(x[k]) - lse_ref)).margin(1e-6).epsilon(1e-4));
        }
    }
}

TEST_CASE("the FlashAttention-1 output update equals a one-shot weighted average") {
    // Two blocks with one value each per key; O after both blocks must be sum p_k v_k.
    std::mt19937 gen(Catch::rngSeed() + 3);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (int trial = 0; trial < 100; ++trial) {
        std::vector<float> s(8), v(8);
        for (int k = 0; k < 8; ++k) s[k] = dist(gen), v[k] = dist(gen);
        const std::size_t cut = 1 + gen() % 7;
        SoftmaxState running;
        float o = 0;
        for (auto [b, e] : {std::pair<std::size_t, std::size_t>{0, cut}, {cut, 8}}) {
            const SoftmaxState blk = block_state(s, b, e);
            float pv = 0;
            for (std::size_t k = b; k < e; ++k) pv += exp_shifted(s[k], blk.m) * v[k];
            const SoftmaxMerge r = merge_softmax(running, blk);
            o = fa1_output_update(o, running.l, pv, r);
            running = {r.m_new, r.l_new};
        }
        double m = -INFINITY, l = 0, ref = 0;
        for (float x : s) m = std::max(m, double(x));
        for (int k = 0; k < 8; ++k) l += std::exp(s[k] - m), ref += std::exp(s[k] - m) * v[k];
        CHECK(o == Approx(ref / l).margin(1e-5).epsilon(1e-5));
    }
}

TEST_CASE("fully masked rows stay finite and NaN is never dropped") {
    SoftmaxState empty;
    const SoftmaxMerge both_empty = merge_softmax(empty, empty);
    CHECK(both_empty.l_new == 0.0f);
    CHECK_FALSE(std::isnan(both_empty.old_scale));
    CHECK_FALSE(std::isnan(both_empty.block_scale));
    CHECK(fa1_output_update(0.0f, 0.0f, 0.0f, both_empty) == 0.0f);
    CHECK(normalize_output(0.0f, 0.0f) == 0.0f);
    CHECK(log_sum_exp(empty) == -INFINITY);
    CHECK(exp_shifted(-INFINITY, -INFINITY) == 0.0f);

    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(nan_max(nan, 1.0f)));
    CHECK(std::isnan(nan_max(1.0f, nan)));
    CHECK(std::isnan(nan_max(-INFINITY, nan)));
    const SoftmaxMerge poisoned = merge_softmax({1.0f, 1.0f}, {nan, 1.0f});
    CHECK(std::isnan(poisoned.l_new));
    CHECK(std::isnan(log_sum_exp({poisoned.m_new, poisoned.l_new})));
}

TEST_CASE("huge finite logits stay finite and exact") {
    const SoftmaxMerge r = merge_softmax({1e4f, 1.0f}, {-1e4f, 1.0f});
    CHECK(r.m_new == 1e4f);
    CHECK(r.l_new == 1.0f);  // exp(-2e4) underflows to 0 exactly
    CHECK(log_sum_exp({r.m_new, r.l_new}) == 1e4f);
}

TEST_CASE("exp2_shifted (raw scores, scale folded into log2 e) equals exp_shifted of scaled scores") {
    std::mt19937 gen(Catch::rngSeed() + 29);
    std::normal_distribution<float> dist(0.0f, 30.0f);
    for (float scale : {0.125f, 0.3f, 1.0f, 8.0f}) {
        const float c = scale * kLog2e;
        for (int trial = 0; trial < 1000; ++trial) {
            const float m = dist(gen);
            const float s = std::min(m, dist(gen));  // s <= m, as in a row
            const double got = exp2_shifted(s, exp2_shift(m, c), c);
            const double want = std::exp((double(s) - double(m)) * scale);
            // float arguments s c and m c carry rounding errors of 2^-24 |s c| and 2^-24 |m c|:
            // that much relative error in the result is inherent (exp_shifted has it too).
            const double tol = 1e-6 + 3 * std::ldexp(1.0, -24) * (std::fabs(s) + std::fabs(m)) * scale;
            INFO("s = " << s << ", m = " << m << ", scale = " << scale);
            CHECK(std::fabs(got - want) <= tol * want + 1e-37);
        }
    }
    // The conventions exp_shifted has: a masked score gives 0, also in a row masked so far.
    const float c = 0.125f * kLog2e;
    CHECK(exp2_shift(-INFINITY, c) == 0.0f);
    CHECK(exp2_shifted(-INFINITY, exp2_shift(-INFINITY, c), c) == 0.0f);
    CHECK(exp2_shifted(-INFINITY, exp2_shift(3.0f, c), c) == 0.0f);
    CHECK(exp2_shifted(3.0f, exp2_shift(3.0f, c), c) == 1.0f);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(exp2_shifted(nan, exp2_shift(3.0f, c), c)));
    CHECK(std::isnan(exp2_shifted(1.0f, exp2_shift(nan, c), c)));
}

namespace {

// One part's attention for a query row over keys [begin, end) of (n x d) K and V, in float64:
// O normalized by the part's own sum, LSE = m + log(l); an empty part gives O = 0, LSE = -inf.
struct Part {
    std::vector<double> O;
    double lse;
};
Part part_attention(const std::vector<double>& s, const std::vector<double>& V, std::size_t d,
                    std::size_t begin, std::size_t end) {
    Part r{std::vector<double>(d, 0.0), -INFINITY};
    if (begin == end) return r;
    double m = -INFINITY;
    for (std::size_t j = begin; j < end; ++j) m = std::max(m, s[j]);
    double l = 0;
    for (std::size_t j = begin; j < end; ++j) {
        const double p = std::exp(s[j] - m);
        l += p;
        for (std::size_t c = 0; c < d; ++c) r.O[c] += p * V[j * d + c];
    }
    for (double& o : r.O) o /= l;
    r.lse = m + std::log(l);
    return r;
}

// Merges float32 parts left to right (or as a balanced tree) with merge_partials.
std::pair<std::vector<float>, float> merge_all(const std::vector<std::vector<float>>& O,
                                               const std::vector<float>& lse, bool tree) {
    std::vector<std::vector<float>> o = O;
    std::vector<float> l = lse;
    while (o.size() > 1) {
        std::vector<std::vector<float>> o2;
        std::vector<float> l2;
        const std::size_t step = tree ? 2 : o.size();
        for (std::size_t a = 0; a < o.size(); a += step) {
            std::vector<float> acc = o[a];
            float acc_lse = l[a];
            for (std::size_t b = a + 1; b < std::min(a + step, o.size()); ++b) {
                const PartialMerge m = merge_partials(acc_lse, l[b]);
                for (std::size_t c = 0; c < acc.size(); ++c)
                    acc[c] = m.scale_a * acc[c] + m.scale_b * o[b][c];
                acc_lse = m.lse;
            }
            o2.push_back(acc), l2.push_back(acc_lse);
        }
        o = o2, l = l2;
    }
    return {o[0], l[0]};
}

}  // namespace

TEST_CASE("merging partial results over disjoint key sets gives the whole row's attention") {
    std::mt19937 gen(Catch::rngSeed() + 23);
    for (int trial = 0; trial < 300; ++trial) {
        const std::size_t n = 1 + gen() % 200, d = 1 + gen() % 40;
        const double spread = 1.0 + trial % 5 * 20.0;  // scores up to ~ +-300
        std::normal_distribution<double> dist(0.0, 1.0);
        std::vector<double> s(n), V(n * d);
        for (double& x : s) x = spread * dist(gen);
        for (double& x : V) x = dist(gen);
        // Cut the keys into 1..6 parts at random points; parts may be empty.
        std::vector<std::size_t> cuts = {0, n};
        for (std::size_t c = gen() % 6; c > 0; --c) cuts.push_back(gen() % (n + 1));
        std::sort(cuts.begin(), cuts.end());
        std::vector<std::vector<float>> O;
        std::vector<float> lse;
        for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
            const Part part = part_attention(s, V, d, cuts[k], cuts[k + 1]);
            O.emplace_back(part.O.begin(), part.O.end());
            lse.push_back(float(part.lse));
        }
        const Part whole = part_attention(s, V, d, 0, n);
        for (bool tree : {false, true}) {
            INFO("trial " << trial << ", n = " << n << ", " << O.size() << " parts, "
                          << (tree ? "tree" : "left to right"));
            const auto [o, l] = merge_all(O, lse, tree);
            // The parts' LSEs are rounded to float32 (half an ulp of |LSE|, up to ~300 here), and
            // each merge step adds a few ulp: a weight e^(LSE_a - LSE) is that far off relatively.
            double largest = 1;
            for (float x : lse) largest = std::max(largest, std::isfinite(x) ? std::fabs(x) : 0.0);
            const double tol = 4 * O.size() * 1.2e-7 * largest;
            CHECK(std::fabs(l - whole.lse) <= tol);
            double v_max = 0;
            for (double x : V) v_max = std::max(v_max, std::fabs(x));
            for (std::size_t c = 0; c < d; ++c)
                CHECK(std::fabs(o[c] - whole.O[c]) <= 2 * tol * v_max + 1e-6);
        }
    }
}

TEST_CASE("merging partials: empty parts add nothing, two empty give the empty row, NaN stays") {
    const float inf = INFINITY, nan = NAN;
    PartialMerge m = merge_partials(-inf, 2.5f);  // an empty part beside one that saw keys
    CHECK(m.lse == 2.5f);
    CHECK(m.scale_a == 0.0f);
    CHECK(m.scale_b == 1.0f);
    m = merge_partials(-inf, -inf);  // no key in either: O = 0, LSE = -inf, never NaN
    CHECK(m.lse == -inf);
    CHECK(m.scale_a == 0.0f);
    CHECK(m.scale_b == 0.0f);
    m = merge_partials(nan, 1.0f);  // a NaN is never hidden
    CHECK(std::isnan(m.lse));
    CHECK(std::isnan(m.scale_a));
    m = merge_partials(1e4f, -1e4f);  // huge finite LSEs: the far smaller part weighs 0, no overflow
    CHECK(m.lse == 1e4f);
    CHECK(m.scale_a == 1.0f);
    CHECK(m.scale_b == 0.0f);
    m = merge_partials(std::log(3.0f), std::log(1.0f));  // weights 3/4 and 1/4
    CHECK(m.lse == Approx(std::log(4.0f)).epsilon(1e-6));
    CHECK(m.scale_a == Approx(0.75f).epsilon(1e-6));
    CHECK(m.scale_b == Approx(0.25f).epsilon(1e-6));
}

TEST_CASE("a row with l = 0 is NaN when it sees a key (its scores overflowed), O = 0 / LSE = -inf when it sees none") {
    int asked = 0;
    const auto sees_a_key = [&] { return ++asked, true; };
    CHECK_FALSE(scores_overflowed(SoftmaxState{3.0f, 2.5f}, sees_a_key));
    CHECK_FALSE(scores_overflowed(SoftmaxState{-3e38f, 2.5f}, sees_a_key));  // LSE finite
    CHECK(asked == 0);  // the predicate is not evaluated while l > 0
    CHECK(scores_overflowed(SoftmaxState{-INFINITY, 0.0f}, sees_a_key));
    CHECK_FALSE(scores_overflowed(SoftmaxState{-INFINITY, 0.0f}, [] { return false; }));
    // Weights computed, but m (in LSE's units, scale times the raw maximum) beyond float32.
    CHECK(scores_overflowed(SoftmaxState{INFINITY, 1.0f}, sees_a_key));
    CHECK(scores_overflowed(SoftmaxState{-INFINITY, 3.0f}, sees_a_key));
    CHECK(scores_overflowed(SoftmaxState{5.0f, INFINITY}, sees_a_key));  // weights beyond float32
    // The test without a log agrees with |m + log(l)| = inf, at the edges of float32 too.
    for (float m : {3.4e38f, -3.4e38f, 3.0e38f, 1e30f, -1e30f, 0.0f, 88.0f})
        for (float l : {1e-30f, 1.0f, 1e30f, 3.4e38f, 5e-45f}) {
            INFO("m = " << m << ", l = " << l);
            CHECK(scores_overflowed(SoftmaxState{m, l}, sees_a_key) ==
                  (std::fabs(m + std::log(l)) == INFINITY));
        }
    CHECK(asked == 1);
    CHECK(std::isnan(final_output(0.0f, 0.0f, true)));
    CHECK(std::isnan(final_lse(SoftmaxState{}, true)));
    CHECK(final_output(0.0f, 0.0f, false) == 0.0f);
    CHECK(final_lse(SoftmaxState{}, false) == -INFINITY);
    CHECK(final_output(3.0f, 2.0f, false) == 1.5f);
    CHECK(std::isnan(final_output_scaled(0.0f, output_scale(0.0f), true)));
    CHECK(final_output_scaled(0.0f, output_scale(0.0f), false) == 0.0f);  // no visible key
    CHECK(std::isnan(final_output_scaled(NAN, output_scale(0.0f), false)));  // kept as summed
    CHECK(final_output_scaled(3.0f, output_scale(2.0f), false) == 1.5f);
}

TEST_CASE("the epilogue's one reciprocal per row stays within 2 ulp of dividing each element") {
    // Random O values of either sign and sums l >= 1 (a row's largest score contributes e^0),
    // fresh each run; the distance counted in float32 steps (ulp) from the exactly rounded o / l.
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> o_dist(-1e4f, 1e4f), log_l(0.0f, 30.0f);
    const auto ulps = [](float a, float b) {
        int steps = 0;
        for (float x = std::min(a, b); x < std::max(a, b) && steps < 100; ++steps)
            x = std::nextafter(x, INFINITY);
        return steps;
    };
    int worst = 0;
    for (int t = 0; t < 20000; ++t) {
        const float o = o_dist(rng), l = std::exp(log_l(rng));
        const float by_division = final_output(o, l, false);
        const float by_scale = final_output_scaled(o, output_scale(l), false);
        worst = std::max(worst, ulps(by_division, by_scale));
        INFO("o = " << o << ", l = " << l);
        REQUIRE(ulps(by_division, by_scale) <= 2);
    }
    INFO("worst distance: " << worst << " ulp");
    CHECK(worst >= 1);  // the two do differ: the test compares two different roundings
}

TEST_CASE("row_has_visible_key follows the bottom-right causal mask and the block mask's row") {
    AttentionProblem p;
    p.seq_q = 40, p.seq_kv = 24, p.dim = 8, p.causal = true;  // rows 0..15 see no key
    CHECK_FALSE(p.row_has_visible_key(15));
    CHECK(p.row_has_visible_key(16));
    // 8 x 8 blocks, Tc = 3: row block 2 (rows 16..23) all zero; row block 3 only its last block,
    // which lies past the causal diagonal of rows 24..31 until row 32 - 1 = 31 (key 15 < 16).
    const std::uint8_t mask[5 * 3] = {1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0};
    p.block_mask = {mask, 8, 8};
    CHECK_FALSE(p.row_has_visible_key(20));
    CHECK_FALSE(p.row_has_visible_key(31));  // sees keys 0..15, its mask row allows 16..23
    CHECK(p.row_has_visible_key(32));        // row block 4: block 0 allowed
    p.causal = false;
    CHECK(p.row_has_visible_key(31));
    CHECK_FALSE(p.row_has_visible_key(20));
}

namespace {

// The merge of S parts computed independently in float64: LSE = log sum_s e^(LSE_s) (shifted by
// the largest finite LSE_s), O = sum_s e^(LSE_s - LSE) O_s; no finite part gives O = 0, LSE = -inf.
Part log_sum_exp_merge(const std::vector<double>& lse, const std::vector<std::vector<double>>& O,
                       std::size_t d) {
    double m = -INFINITY;
    for (double x : lse) m = std::max(m, x);
    Part r{std::vector<double>(d, 0.0), -INFINITY};
    if (m == -INFINITY) return r;
    double sum = 0;
    for (double x : lse) sum += std::exp(x - m);
    r.lse = m + std::log(sum);
    for (std::size_t s = 0; s < lse.size(); ++s)
        for (std::size_t c = 0; c < d; ++c) r.O[c] += std::exp(lse[s] - r.lse) * O[s][c];
    return r;
}

}  // namespace

TEST_CASE("merge_partial_row folds S strided parts into the float64 log-sum-exp merge") {
    std::mt19937 gen(Catch::rngSeed() + 29);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int trial = 0; trial < 300; ++trial) {
        const int S = 1 + int(gen() % 8);
        const std::size_t d = 1 + gen() % 40;
        const float spread = 1.0f + float(trial % 4) * 30.0f;  // LSEs up to ~ +-400
        // Parts laid out as a caller's arrays: LSE_s at lse[s * 3], O_s's row at O_parts + s * (d + 5).
        const std::int64_t lse_stride = 3, o_stride = std::int64_t(d) + 5;
        std::vector<float> lse(std::size_t(S * lse_stride), NAN), O_parts(std::size_t(S * o_stride), NAN);
        std::vector<double> lse64(S);
        std::vector<std::vector<double>> O64(S, std::vector<double>(d));
        for (int s = 0; s < S; ++s) {
            const bool empty = gen() % 4 == 0;  // a part that saw no key: LSE = -inf, O = 0
            lse[s * lse_stride] = empty ? -INFINITY : spread * dist(gen);
            lse64[s] = lse[s * lse_stride];
            for (std::size_t c = 0; c < d; ++c) {
                O_parts[s * o_stride + c] = empty ? 0.0f : dist(gen);
                O64[s][c] = O_parts[s * o_stride + c];
            }
        }
        const Part expected = log_sum_exp_merge(lse64, O64, d);
        std::vector<float> O(d, NAN);
        const float merged = merge_partial_row(S, lse.data(), lse_stride, O_parts.data(), o_stride,
                                               std::int64_t(d), 0, 1, O.data());
        INFO("trial " << trial << ", S = " << S << ", d = " << d);
        if (expected.lse == -INFINITY) {  // every part empty: the empty row, never NaN
            CHECK(merged == -INFINITY);
            for (float o : O) CHECK(o == 0.0f);
            continue;
        }
        // Each fold step rounds the running LSE and the two weights to float32: a few ulp of
        // the largest |LSE| per step, relative to the weights.
        double largest = 1;
        for (double x : lse64) largest = std::max(largest, std::isfinite(x) ? std::fabs(x) : 0.0);
        const double tol = 4 * S * 1.2e-7 * largest;
        CHECK(std::fabs(merged - expected.lse) <= tol);
        for (std::size_t c = 0; c < d; ++c)
            CHECK(std::fabs(O[c] - expected.O[c]) <= 2 * tol * 4.0 + 1e-6);  // |O_s| < ~4

        // A warp's split of the columns (first, step) writes its own columns, the same values.
        std::vector<float> lanes(d, 12345.0f);
        for (std::int64_t first = 0; first < 3; first += 2)  // lanes 0 and 2 of 3; lane 1 idle
            CHECK(merge_partial_row(S, lse.data(), lse_stride, O_parts.data(), o_stride,
                                    std::int64_t(d), first, 3, lanes.data()) == merged);
        for (std::size_t c = 0; c < d; ++c) CHECK(lanes[c] == (c % 3 == 1 ? 12345.0f : O[c]));
    }
}

TEST_CASE("lse_from_max_and_sum: the two-pass merged LSE is the float64 log-sum-exp") {
    std::mt19937 gen(Catch::rngSeed() + 31);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int trial = 0; trial < 300; ++trial) {
        const int S = 1 + int(gen() % 70);  // more parts than a warp has lanes, at times
        const float spread = 1.0f + float(trial % 4) * 30.0f;
        std::vector<float> lse(S);
        for (float& x : lse) x = gen() % 4 == 0 ? -INFINITY : spread * dist(gen);
        // The passes as a warp runs them, in any order: the maximum, then the sum below it.
        float m = -INFINITY;
        for (float x : lse) m = nan_max(m, x);
        float sum = 0.0f;
        for (float x : lse) sum += exp_shifted(x, m);
        const float merged = lse_from_max_and_sum(m, sum);
        double m64 = -INFINITY, sum64 = 0;
        for (float x : lse) m64 = std::max(m64, double(x));
        for (float x : lse) sum64 += x == -INFINITY ? 0.0 : std::exp(double(x) - m64);
        INFO("trial " << trial << ", S = " << S);
        if (m64 == -INFINITY) {  // every part empty: the empty row's LSE, never NaN
            CHECK(merged == -INFINITY);
            continue;
        }
        const double expected = m64 + std::log(sum64);
        // One rounding of m + log(sum) and S of the float32 sum: ulps of |m| and of log(S).
        CHECK(std::fabs(merged - expected) <= 2.4e-7 * std::fabs(m64) + 1.2e-7 * (S + 1));
        // It agrees with merged_lse's fold to rounding.
        CHECK(std::fabs(merged - merged_lse(S, lse.data(), 1)) <=
              4 * S * 1.2e-7 * std::max(1.0, std::fabs(m64)));
    }
    CHECK(std::isnan(lse_from_max_and_sum(NAN, 1.0f)));  // a NaN LSE is never hidden
    CHECK(std::isnan(lse_from_max_and_sum(nan_max(1.0f, NAN), 2.0f)));
}

TEST_CASE("merge_partial_row: a NaN LSE makes the row NaN, a NaN in one O_s its column") {
    const int S = 3;
    const std::int64_t d = 4;
    std::vector<float> lse = {0.5f, -INFINITY, 2.0f};
    std::vector<float> O_parts = {1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8};
    std::vector<float> O(d);
    O_parts[2 * d + 1] = NAN;  // part 2, column 1
    float merged = merge_partial_row(S, lse.data(), 1, O_parts.data(), d, d, 0, 1, O.data());
    CHECK(std::isfinite(merged));
    CHECK(std::isnan(O[1]));
    CHECK((std::isfinite(O[0]) && std::isfinite(O[2]) && std::isfinite(O[3])));
    O_parts[2 * d + 1] = 6;
    lse[1] = NAN;  // the NaN sits in the empty part's place: it must not be taken for -inf
    merged = merge_partial_row(S, lse.data(), 1, O_parts.data(), d, d, 0, 1, O.data());
    CHECK(std::isnan(merged));
    for (float o : O) CHECK(std::isnan(o));
}

// keeps_reference_max (FlashAttention-4's conditional rescale, used by cuda-fa3 at d = 256 and
// cuda-tc's forward at d >= 128): a reference is kept while a block's maximum exceeds it by at most
// 2^8 in the base-2 exponent; nothing seen yet or a NaN always takes Algorithm 1's update.
TEST_CASE("keeps_reference_max: kept up to 2^8 above the reference, moved beyond, never for -inf or NaN") {
    const float c = 0.125f * kLog2e;  // scale 1/8 (d = 64)
    const float r = 3.0f;
    CHECK(keeps_reference_max(r, r, c));
    CHECK(keeps_reference_max(r, r + 0.99f * kLazyRescaleLog2 / c, c));
    CHECK_FALSE(keeps_reference_max(r, r + 1.01f * kLazyRescaleLog2 / c, c));
    CHECK_FALSE(keeps_reference_max(-INFINITY, 5.0f, c));
    CHECK_FALSE(keeps_reference_max(-INFINITY, -INFINITY, c));
    CHECK_FALSE(keeps_reference_max(r, NAN, c));
    CHECK_FALSE(keeps_reference_max(r, INFINITY, c));
}

// Why the kernels may keep a reference: a row's softmax-weighted sum taken block by block against
// a reference moved only when keeps_reference_max says so (float32, as a kernel runs it) equals
// the float64 softmax of the whole row, on rows whose scores climb so that the reference is kept
// at some blocks and moved at others.
TEST_CASE("a row's online softmax against a lazily moved reference is the whole row's softmax") {
    std::mt19937 gen(Catch::rngSeed() + 71);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float c = kLog2e;  // raw scores in nats: 2^(s c) = e^s
    int kept_blocks = 0, later_moves = 0;  // both branches must have run
    for (int trial = 0; trial < 100; ++trial) {
        const int n = 1 + int(gen() % 700), block = 1 + int(gen() % 90);
        const float climb = 0.02f * float(gen() % 10);  // per key, in nats
        std::vector<float> s(n), v(n);
        for (int k = 0; k < n; ++k) s[k] = climb * float(k) + 3.0f * normal(gen), v[k] = normal(gen);
        // float64 softmax of the whole row: sum_k softmax(s)_k v_k and its log-sum-exp.
        const double m64 = *std::max_element(s.begin(), s.end());
        double l64 = 0, o64 = 0;
        for (int k = 0; k < n; ++k) l64 += std::exp(double(s[k]) - m64), o64 += std::exp(double(s[k]) - m64) * v[k];
        // Block by block with the lazy reference r.
        float r = -INFINITY, l = 0.0f, o = 0.0f;
        int moves = 0;
        for (int b0 = 0; b0 < n; b0 += block) {
            const int b1 = std::min(n, b0 + block);
            float m_new = r;
            for (int k = b0; k < b1; ++k) m_new = nan_max(m_new, s[k]);
            if (!keeps_reference_max(r, m_new, c)) {
                const float factor = exp2_shifted(r, exp2_shift(m_new, c), c);
                l *= factor, o *= factor, r = m_new, ++moves;
                later_moves += b0 > 0;
            } else {
                ++kept_blocks;
            }
            for (int k = b0; k < b1; ++k) {
                const float p = exp2_shifted(s[k], exp2_shift(r, c), c);
                REQUIRE(p <= 257.0f);  // the bound that keeps fp16's P~ in range
                l += p, o += p * v[k];
            }
        }
        INFO("n " << n << " block " << block << " climb " << climb << " moves " << moves);
        CHECK(moves >= 1);
        CHECK(std::abs(double(o / l) - o64 / l64) <= 1e-5 * (1.0 + std::abs(o64 / l64)));
        CHECK(std::abs(double(r) + std::log(double(l)) - (m64 + std::log(l64))) <= 1e-5 * (1.0 + std::abs(m64)));
    }
    CHECK(kept_blocks > 0);
    CHECK(later_moves > 0);
}
