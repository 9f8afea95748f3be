// tests/test_edge_cases.cpp — numeric edge cases on every backend: N = 1, d = 1, fully
// masked rows, huge logits, all-equal scores, NaN placement, subnormal inputs, and two properties
// of softmax that any correct form keeps: a constant added to a row's scores changes nothing, and
// neither does the order of the keys.
//
// Inputs here are often "dyadic": multiples of 1/8 in [-2, 2]. Their products and sums of up to
// 256 terms are exact in float32 (and the values exact in f16 and bf16), so every backend sees
// exactly the same scores whatever order it sums in, and a huge logit or a shifted row is a test
// of the softmax, not of rounding luck.
#include <algorithm>
#include <array>
#include <numeric>
#include <random>

#include "backends_under_test.hpp"
#include "common/tiling.hpp"
#include "input_dependence.hpp"

using namespace flashattn;
using test::check_against_reference;
using test::make_problem;
using test::Outputs;

namespace {

// Multiples of 1/8 in [-range, range].
std::vector<float> dyadic(std::int64_t count, std::mt19937_64& gen, float range = 2.0f) {
    std::uniform_int_distribution<int> steps(-static_cast<int>(8 * range),
                                             static_cast<int>(8 * range));
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = static_cast<float>(steps(gen)) / 8.0f;
    return v;
}

ProblemData dyadic_data(const AttentionProblem& p) {
    std::mt19937_64 gen(test::next_seed());
    ProblemData in;
    in.Q = dyadic(p.q_elements(), gen);
    in.K = dyadic(p.kv_elements(), gen);
    in.V = dyadic(p.kv_elements(), gen);
    return in;
}

// Element (b, h, row, c) of a (batch, heads, rows, dim) array.
std::size_t at(std::int64_t b, std::int64_t h, std::int64_t heads, std::int64_t rows,
               std::int64_t row, std::int64_t d, std::int64_t c) {
    return static_cast<std::size_t>(((b * heads + h) * rows + row) * d + c);
}

bool attends_any(const AttentionProblem& p, std::int64_t i) {
    for (std::int64_t j = 0; j < p.seq_kv; ++j)
        if (p.key_visible(i, j)) return true;
    return false;
}

// Every backend (that takes p) on inputs `in`: the 2x rule, then `extra` on its outputs.
template <class Extra>
void on_every_backend(const AttentionProblem& p, const ProblemData& in, Extra extra) {
    for (const Backend& b : available_backends()) {
        if (!test::backend_accepts(b, p)) continue;
        INFO(b.name << " " << test::describe(p));
        const Outputs out = check_against_reference(b, p, in, test::test_dtype(b));
        extra(b, out);
    }
}
void on_every_backend(const AttentionProblem& p, const ProblemData& in) {
    on_every_backend(p, in, [](const Backend&, const Outputs&) {});
}

}  // namespace

TEST_CASE("edge: N = 1 and d = 1, alone and together, causal or not") {
    const std::vector<std::array<std::int64_t, 3>> shapes = {{1, 1, 1},   {1, 1, 64},   {1, 1, 111},
                                                             {1, 203, 1}, {203, 1, 1},  {1, 57, 59},
                                                             {57, 1, 3},  {113, 203, 1}};
    for (auto [Nq, Nkv, d] : shapes)
        for (bool causal : {false, true}) {
            AttentionProblem p = make_problem(2, 3, 3, Nq, Nkv, d);
            p.causal = causal;
            on_every_backend(p, random_problem_data(p, test::next_seed()));
        }
}

TEST_CASE("edge: a single key gives O = V of that key on every backend") {
    AttentionProblem p = make_problem(2, 4, 2, 9, 1, 7);
    const ProblemData in = dyadic_data(p);
    on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
        for (std::int64_t b = 0; b < p.batch; ++b)
            for (std::int64_t h = 0; h < p.heads; ++h)
                for (std::int64_t i = 0; i < p.seq_q; ++i)
                    for (std::int64_t c = 0; c < p.dim; ++c)
                        CHECK(out.O[at(b, h, p.heads, p.seq_q, i, p.dim, c)] ==
                              Approx(in.V[at(b, p.kv_head(h), p.heads_kv, 1, 0, p.dim, c)])
                                  .margin(1e-6));
    });
}

TEST_CASE("edge: fully masked rows give O = 0 and LSE = -inf exactly, never NaN") {
    std::mt19937 gen(Catch::rngSeed() + 11);
    std::vector<std::uint8_t> mask;
    for (auto [Nq, Nkv] :
         std::vector<std::pair<std::int64_t, std::int64_t>>{{9, 4}, {113, 7}, {5, 1}, {203, 113}}) {
        AttentionProblem p = make_problem(2, 4, 2, Nq, Nkv, 13);
        p.causal = true;  // bottom-right: rows i < Nq - Nkv attend nothing
        const ProblemData in = random_problem_data(p, test::next_seed());
        on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
            for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh)
                for (std::int64_t i = 0; i < p.seq_q; ++i) {
                    const float lse = out.lse[bh * p.seq_q + i];
                    const bool masked = i < p.seq_q - p.seq_kv;
                    INFO("row " << i << (masked ? " (fully masked)" : ""));
                    CHECK(masked == !attends_any(p, i));
                    if (!masked) {
                        CHECK(std::isfinite(lse));
                        continue;
                    }
                    CHECK(lse == -std::numeric_limits<float>::infinity());
                    for (std::int64_t c = 0; c < p.dim; ++c)
                        CHECK(out.O[(bh * p.seq_q + i) * p.dim + c] == 0.0f);
                }
        });
    }
    // Block masks: a row of zero blocks, an all-zero mask, and zero blocks under causal.
    for (int variant = 0; variant < 3; ++variant) {
        AttentionProblem p = make_problem(1, 3, 1, 37, 29, 6);
        p.causal = variant == 2;
        mask.assign(tile_count(p.seq_q, 5) * tile_count(p.seq_kv, 4), 0);
        if (variant != 1)
            for (auto& m : mask) m = gen() % 3 != 0;
        if (variant == 0)
            std::fill_n(mask.begin() + 2 * tile_count(p.seq_kv, 4), tile_count(p.seq_kv, 4), 0);
        if (variant == 2) std::fill(mask.end() - tile_count(p.seq_kv, 4), mask.end(), 0);
        p.block_mask = {mask.data(), 5, 4};
        on_every_backend(
            p, random_problem_data(p, test::next_seed()), [&](const Backend&, const Outputs& out) {
                std::int64_t masked_rows = 0;
                for (std::int64_t h = 0; h < p.heads; ++h)
                    for (std::int64_t i = 0; i < p.seq_q; ++i) {
                        if (attends_any(p, i)) continue;
                        ++masked_rows;
                        CHECK(out.lse[h * p.seq_q + i] == -std::numeric_limits<float>::infinity());
                        for (std::int64_t c = 0; c < p.dim; ++c)
                            CHECK(out.O[(h * p.seq_q + i) * p.dim + c] == 0.0f);
                    }
                CHECK(masked_rows >= 5 * p.heads);  // the case really has fully masked rows
            });
    }
}

TEST_CASE("edge: a visible key whose float32 score would overflow is refused on every backend") {
    // q . k = -4e60 is finite in the float64 reference (weight 1: O = V, here NaN) but -inf in
    // float32, where the key would get weight 0 and l = 0, as if masked, and V's NaN would be
    // lost (found by fuzz_backends). Such scores cannot be held in float32, so every backend,
    // CPU and GPU alike, refuses the problem naming the scale (common/score_range.hpp) instead
    // of returning a row that reads as fully masked.
    AttentionProblem p = make_problem(1, 2, 1, 5, 3, 4);
    ProblemData in = random_problem_data(p, test::next_seed());
    for (std::int64_t c = 0; c < p.dim; ++c) {
        in.Q[at(0, 1, p.heads, p.seq_q, 2, p.dim, c)] = 1e30f;  // head 1, row 2
        in.K[at(0, 0, p.heads_kv, p.seq_kv, 1, p.dim, c)] = -1e30f;
    }
    in.V[at(0, 0, p.heads_kv, p.seq_kv, 1, p.dim, 3)] = std::numeric_limits<float>::quiet_NaN();
    for (const Backend& b : available_backends()) {
        if (!b.supports(test::test_dtype(b))) continue;
        INFO(b.name);
        std::vector<float> O(p.q_elements(), 7.0f), lse(p.lse_elements(), 7.0f);  // poisoned
        CHECK_THROWS_WITH(run_backend(b, p, in.Q.data(), in.K.data(), in.V.data(), O.data(),
                                      lse.data(), test::test_dtype(b)),
                          Catch::StartsWith("scale = 0.5: ") && Catch::Contains("float32"));
        CHECK(std::all_of(O.begin(), O.end(), [](float x) { return x == 7.0f; }));  // untouched
    }
}

TEST_CASE("edge: logits of +-1e4 stay finite and accurate") {
    for (bool causal : {false, true}) {
        // Dyadic q.k up to ~+-30, times scale 1024 (a power of two, so still exact).
        AttentionProblem p = make_problem(2, 2, 1, 67, 91, 16);
        p.causal = causal;
        p.scale = 1024.0f;
        const ProblemData in = dyadic_data(p);
        on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
            for (float o : out.O) CHECK(std::isfinite(o));
            float largest = 0;
            for (float l : out.lse) {
                CHECK(std::isfinite(l));
                largest = std::max(largest, std::fabs(l));
            }
            CHECK(largest > 1e4f);  // the case really has logits that large
        });
    }
}

TEST_CASE("edge: one huge logit (+1e4) takes all the weight, one of -1e4 takes none") {
    for (float huge : {1e4f, -1e4f})
        for (bool causal : {false, true}) {
            AttentionProblem p = make_problem(1, 2, 2, 23, 41, 9);
            p.causal = causal;
            p.scale = 1.0f;
            ProblemData in = dyadic_data(p);
            const std::int64_t star = 17;  // the key with the huge logit
            for (std::int64_t bh = 0; bh < 2; ++bh) {
                for (std::int64_t i = 0; i < p.seq_q; ++i) in.Q[(bh * p.seq_q + i) * p.dim] = 1.0f;
                in.K[(bh * p.seq_kv + star) * p.dim] = huge;  // s_i,star = huge + O(10)
            }
            on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
                if (huge < 0) return;  // -1e4: the 2x rule against the reference says it all
                for (std::int64_t bh = 0; bh < 2; ++bh)
                    for (std::int64_t i = 0; i < p.seq_q; ++i) {
                        if (!p.key_visible(i, star)) continue;
                        for (std::int64_t c = 0; c < p.dim; ++c)
                            CHECK(out.O[(bh * p.seq_q + i) * p.dim + c] ==
                                  Approx(in.V[(bh * p.seq_kv + star) * p.dim + c]).margin(1e-6));
                    }
            });
        }
}

TEST_CASE("edge: all-equal scores give the mean of the visible values") {
    for (int how = 0; how < 2; ++how)
        for (bool causal : {false, true}) {
            AttentionProblem p = make_problem(2, 3, 1, 31, 47, 11);
            p.causal = causal;
            ProblemData in = random_problem_data(p, test::next_seed());
            if (how == 0) {
                p.scale = 0.0f;  // every score is 0
            } else {
                for (std::int64_t j = 1; j < p.batch * p.seq_kv; ++j)  // every key the same
                    std::copy_n(in.K.begin(), p.dim, in.K.begin() + j * p.dim);
            }
            on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
                for (std::int64_t b = 0; b < p.batch; ++b)
                    for (std::int64_t h = 0; h < p.heads; ++h)
                        for (std::int64_t i = 0; i < p.seq_q; ++i) {
                            std::int64_t n = 0;
                            std::vector<double> mean(p.dim, 0.0);
                            for (std::int64_t j = 0; j < p.seq_kv; ++j) {
                                if (!p.key_visible(i, j)) continue;
                                ++n;
                                for (std::int64_t c = 0; c < p.dim; ++c)
                                    mean[c] += in.V[at(b, 0, 1, p.seq_kv, j, p.dim, c)];
                            }
                            if (n == 0) continue;
                            for (std::int64_t c = 0; c < p.dim; ++c)
                                CHECK(out.O[at(b, h, p.heads, p.seq_q, i, p.dim, c)] ==
                                      Approx(mean[c] / n).margin(1e-5));
                            if (how == 0)
                                CHECK(out.lse[p.lse_offset(b, h) + i] ==
                                      Approx(std::log(double(n))).margin(1e-5));
                        }
            });
        }
}

TEST_CASE("edge: subnormal inputs are computed, not turned into NaN") {
    const float tiny = 1e-40f;  // subnormal in float32
    REQUIRE(std::fpclassify(tiny) == FP_SUBNORMAL);
    for (int which = 0; which < 3; ++which) {
        AttentionProblem p = make_problem(1, 2, 2, 19, 23, 8);
        p.causal = which == 2;
        ProblemData in = random_problem_data(p, test::next_seed());
        // 0: Q and K subnormal (scores underflow to 0); 1: V subnormal; 2: all of them.
        const auto shrink = [&](std::vector<float>& x) {
            for (float& v : x) v *= tiny;
        };
        if (which != 1) shrink(in.Q), shrink(in.K);
        if (which != 0) shrink(in.V);
        on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
            for (float o : out.O) CHECK(std::isfinite(o));
            for (float l : out.lse) CHECK(std::isfinite(l));
        });
    }
}

TEST_CASE(
    "NaN in Q row i makes exactly row i NaN, NaN in K/V row j exactly the rows that attend j") {
    // One NaN at (b, head, row, col) of Q, K or V; row -1: that column of every row of the head.
    struct Placement {
        const char* what;
        bool causal;
        std::int64_t Nq, Nkv;
        char tensor;
        std::int64_t b, head, row, col;
        bool makes_nan = true;
    };
    const std::vector<Placement> placements = {
        {"Q row 3 of (b=1, h=2)", false, 13, 17, 'Q', 1, 2, 3, 4},
        {"K row 5 of (b=0, kv head 1), causal", true, 13, 13, 'K', 0, 1, 5, 0},
        {"K row 5, causal with N_q < N_kv", true, 7, 19, 'K', 1, 0, 5, 2},
        {"K row 15, causal, N_q < N_kv (only the last rows attend it)", true, 7, 19, 'K', 1, 0, 15,
         2},
        {"V row 8 column 2 only", false, 11, 23, 'V', 0, 1, 8, 2},
        {"V row 0, causal, N_q > N_kv (the first rows attend nothing)", true, 29, 11, 'V', 1, 1, 0,
         6},
        {"V row 10 (the last key), causal", true, 11, 11, 'V', 0, 0, 10, 1},
        {"Q of a fully masked row (it attends nothing: O = 0)", true, 29, 11, 'Q', 0, 3, 2, 0,
         false},
        {"every K row of one kv head", false, 9, 9, 'K', 1, 1, -1, 3},
    };
    const auto poison = [](const Placement& where, const AttentionProblem& p, ProblemData& in) {
        std::vector<float>& x = where.tensor == 'Q' ? in.Q : where.tensor == 'K' ? in.K : in.V;
        const std::int64_t heads = where.tensor == 'Q' ? p.heads : p.heads_kv;
        const std::int64_t rows = where.tensor == 'Q' ? p.seq_q : p.seq_kv;
        for (std::int64_t r = 0; r < rows; ++r)
            if (where.row < 0 || r == where.row)
                x[at(where.b, where.head, heads, rows, r, p.dim, where.col)] =
                    std::numeric_limits<float>::quiet_NaN();
    };
    for (const Placement& place : placements)
        for (int with_mask = 0; with_mask < 2; ++with_mask) {
            AttentionProblem p = make_problem(2, 4, 2, place.Nq, place.Nkv, 7);  // GQA ratio 2
            p.causal = place.causal;
            std::vector<std::uint8_t> mask;
            if (with_mask) {  // a pattern of 3x4 blocks: key j is hidden from some rows
                const std::int64_t Tr = tile_count(p.seq_q, 3), Tc = tile_count(p.seq_kv, 4);
                for (std::int64_t r = 0; r < Tr; ++r)
                    for (std::int64_t c = 0; c < Tc; ++c) mask.push_back((r + c) % 3 != 1);
                p.block_mask = {mask.data(), 3, 4};
            }
            ProblemData in = random_problem_data(p, test::next_seed());
            poison(place, p, in);
            INFO(place.what << (with_mask ? ", with a block mask" : ""));
            const test::OutputFlags expected = test::expected_nans(p, in);
            const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
            CHECK(test::nans_of(ref.O, ref.lse) == expected);  // the reference obeys the rule too
            // The placement really poisons some rows (and not all of them), or it shows nothing.
            const auto poisoned = std::count(expected.O.begin(), expected.O.end(), true);
            CHECK((poisoned > 0) == place.makes_nan);
            CHECK(poisoned < p.q_elements());
            on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
                CHECK(test::nans_of(out.O, out.lse) == expected);
            });
        }
}

TEST_CASE(
    "property: adding one vector u to every key leaves O unchanged, LSE shifts by scale q_i.u") {
    std::mt19937_64 gen(test::next_seed());
    for (int variant = 0; variant < 4; ++variant) {
        AttentionProblem p =
            make_problem(2, 6, variant == 2 ? 2 : 6, 37, variant == 3 ? 17 : 53, 12);
        p.causal = variant == 1 || variant == 3;
        p.scale = 0.25f;  // a power of two keeps the dyadic scores exact
        const ProblemData in = dyadic_data(p);
        for (const Backend& backend : available_backends()) {
            if (!test::backend_accepts(backend, p)) continue;
            const DType t = test::test_dtype(backend);
            // |u| up to 64 shifts scores by hundreds (a form that skipped the max subtraction
            // would overflow exp); bf16 keeps 8 bits, so k + u must stay within +-10 there.
            const std::vector<float> u = dyadic(p.dim, gen, t == DType::bf16 ? 8.0f : 64.0f);
            ProblemData shifted = in;
            for (std::size_t k = 0; k < shifted.K.size(); ++k) shifted.K[k] += u[k % p.dim];
            INFO(backend.name << " " << test::describe(p));
            const Outputs a = check_against_reference(backend, p, in, t);
            const Outputs s = check_against_reference(backend, p, shifted, t);
            const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
            const Reference ref_s =
                reference_attention(p, shifted.Q.data(), shifted.K.data(), shifted.V.data());
            const RuleBounds bound = rule_bounds(p, in, ref, t);
            const RuleBounds bound_s = rule_bounds(p, shifted, ref_s, t);
            double worst_o = 0, worst_lse = 0;
            for (std::size_t k = 0; k < a.O.size(); ++k)
                worst_o = std::max(worst_o, double(std::fabs(a.O[k] - s.O[k])));
            for (std::int64_t b = 0; b < p.batch; ++b)
                for (std::int64_t h = 0; h < p.heads; ++h)
                    for (std::int64_t i = 0; i < p.seq_q; ++i) {
                        double qu = 0;
                        for (std::int64_t c = 0; c < p.dim; ++c)
                            qu += double(in.Q[at(b, h, p.heads, p.seq_q, i, p.dim, c)]) * u[c];
                        const std::int64_t r = p.lse_offset(b, h) + i;
                        if (!attends_any(p, i)) continue;  // -inf both times
                        worst_lse = std::max(worst_lse,
                                             std::fabs(double(s.lse[r]) - a.lse[r] - p.scale * qu));
                    }
            INFO("max |O(K+u) - O(K)| = " << worst_o << ", LSE shift error " << worst_lse);
            CHECK(worst_o <= bound.O + bound_s.O);
            CHECK(worst_lse <= bound.lse + bound_s.lse);
        }
    }
}

TEST_CASE("property: permuting the rows of K and V together leaves O and LSE unchanged") {
    std::mt19937_64 gen(test::next_seed());
    for (std::int64_t Nkv : {1, 7, 113, 203}) {
        AttentionProblem p = make_problem(2, 4, 2, 29, Nkv, 10);
        const ProblemData in = random_problem_data(p, test::next_seed());
        std::vector<std::int64_t> perm(Nkv);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), gen);
        ProblemData permuted = in;
        for (std::int64_t bh = 0; bh < p.batch * p.heads_kv; ++bh)
            for (std::int64_t j = 0; j < Nkv; ++j)
                for (std::int64_t c = 0; c < p.dim; ++c) {
                    const std::size_t to = (bh * Nkv + j) * p.dim + c;
                    const std::size_t from = (bh * Nkv + perm[j]) * p.dim + c;
                    permuted.K[to] = in.K[from];
                    permuted.V[to] = in.V[from];
                }
        for (const Backend& b : available_backends()) {
            if (!test::backend_accepts(b, p)) continue;
            const DType t = test::test_dtype(b);
            INFO(b.name << " " << test::describe(p));
            const Outputs a = check_against_reference(b, p, in, t);
            const Outputs s = check_against_reference(b, p, permuted, t);
            const RuleBounds bound = rule_bounds(
                p, in, reference_attention(p, in.Q.data(), in.K.data(), in.V.data()), t);
            const RuleBounds bound_s = rule_bounds(
                p, permuted,
                reference_attention(p, permuted.Q.data(), permuted.K.data(), permuted.V.data()), t);
            for (std::size_t k = 0; k < a.O.size(); ++k)
                CHECK(std::fabs(a.O[k] - s.O[k]) <= bound.O + bound_s.O);
            for (std::size_t k = 0; k < a.lse.size(); ++k)
                CHECK(std::fabs(a.lse[k] - s.lse[k]) <= bound.lse + bound_s.lse);
        }
    }
}

// An overflowed score must never read as a mask (docs/design.md, Numerics): a row whose visible
// scores all overflow float32 to -inf would come back as O = 0, LSE = -inf, what a row with no
// visible key returns. Every backend, forward and backward, refuses such a problem up front
// (common/score_range.hpp) with a message that names the scale.
TEST_CASE("edge: scores beyond float32 are refused, never returned as a fully masked row") {
    struct Case {
        const char* what;
        float scale;
        float input_magnitude;  // inputs uniform in +-this
    };
    const Case cases[] = {{"scale -3e38", -3e38f, 1.0f},
                          {"scale +3e38 (would give NaN)", 3e38f, 1.0f},
                          {"scale -1e30, inputs 1e5", -1e30f, 1e5f},
                          {"scale 1/8, inputs 1e20 (q.k overflows before scaling)", 0.125f, 1e20f}};
    for (const Case& c : cases)
        for (bool causal : {false, true}) {
            AttentionProblem p = make_problem(1, 2, 1, 13, 29, 7);
            p.causal = causal;
            p.scale = c.scale;
            std::mt19937_64 gen(test::next_seed());
            std::uniform_real_distribution<float> u(-c.input_magnitude, c.input_magnitude);
            ProblemData in;
            for (auto* v : {&in.Q, &in.K, &in.V}) {
                v->resize(static_cast<std::size_t>(v == &in.Q ? p.q_elements() : p.kv_elements()));
                for (float& x : *v) x = u(gen);
            }
            const std::vector<float> dO(in.Q.size(), 0.5f), O(in.Q.size(), 0.0f),
                lse(static_cast<std::size_t>(p.lse_elements()), 0.0f);
            for (const Backend& b : available_backends()) {
                if (!b.supports(test::test_dtype(b))) continue;
                INFO(b.name << ": " << c.what << (causal ? ", causal" : ""));
                try {
                    b.prepare(p, in.Q.data(), in.K.data(), in.V.data(), test::test_dtype(b));
                    FAIL("forward accepted scores beyond float32");
                } catch (const std::invalid_argument& e) {
                    CHECK_THAT(e.what(), Catch::StartsWith("scale = "));
                    CHECK_THAT(e.what(), Catch::Contains("float32"));
                }
                if (!b.has_backward()) continue;
                const BackwardInputs bin{in.Q.data(), in.K.data(), in.V.data(),
                                         O.data(),    lse.data(),  dO.data()};
                CHECK_THROWS_WITH(b.prepare_backward(p, bin, test::test_dtype(b)),
                                  Catch::StartsWith("scale = "));
            }
        }
}

TEST_CASE("edge: scores near float32's limit are computed, and no visible row reads as masked") {
    // Dyadic inputs in +-2 at d = 9 have |q.k| <= 36, so scale -1e36 gives scores up to ~3.6e37:
    // inside the limit (FLT_MAX / 2), far beyond anything exp() can tell apart from -inf alone.
    for (float scale : {-1e36f, 1e36f})
        for (bool causal : {false, true}) {
            AttentionProblem p = make_problem(1, 2, 2, 23, 37, 9);
            p.causal = causal;
            p.scale = scale;
            const ProblemData in = dyadic_data(p);
            on_every_backend(p, in, [&](const Backend&, const Outputs& out) {
                for (std::int64_t h = 0; h < p.heads; ++h)
                    for (std::int64_t i = 0; i < p.seq_q; ++i) {
                        INFO("head " << h << " row " << i);
                        const float l = out.lse[h * p.seq_q + i];
                        if (attends_any(p, i)) {
                            CHECK(std::isfinite(l));
                        } else {
                            CHECK(l == -std::numeric_limits<float>::infinity());
                        }
                    }
                for (float o : out.O) CHECK(std::isfinite(o));
            });
        }
}
