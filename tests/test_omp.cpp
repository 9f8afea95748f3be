// tests/test_omp.cpp — the omp form (cpu/omp.cpp) against float64 standard attention by the 2x
// rule, with 1, 2 and 3 threads; bitwise-identical results for any thread count; every option
// (scale, bottom-right causal both ways, GQA/MQA, block masks) and the NaN/inf rules.

#include <cmath>
#include <cstring>
#include <random>

#include "common/tiling.hpp"
#include "cpu/omp.hpp"
#include "helpers.hpp"
#include "omp_threads.hpp"

using namespace flashattn;
using flashattn::test::check_against_reference;
using flashattn::test::make_problem;
using flashattn::test::run_poisoned;
using flashattn::test::ThreadCount;

namespace {

const Backend& omp_backend() { return find_backend("omp"); }

// Equal as numbers, NaN where the other is NaN (so -0 equals +0, and NaN equals NaN).
bool same_values(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

}  // namespace

TEST_CASE("omp matches float64 attention on the odd-shape grid with 1, 2 and 3 threads") {
    const int threads = GENERATE(1, 2, 3);
    ThreadCount scope(threads);
    INFO("threads = " << threads);
    for (auto [Nq, Nkv] : test::kOddSeqPairs)
        for (std::int64_t d : test::kOddDims) {
            const bool big = Nq * Nkv * d > 20'000'000;
            check_against_reference(
                omp_backend(), make_problem(big ? 1 : 2, big ? 1 : 3, big ? 1 : 3, Nq, Nkv, d));
        }
}

TEST_CASE("omp: any tile sizes, including 1 and larger than N, give the same attention") {
    ThreadCount scope(2);
    for (auto [Br, Bc] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 7}, {5, 1}, {3, 5}, {16, 64}, {64, 16}, {2000, 2000}}) {
        AttentionProblem p = make_problem(2, 2, 2, 113, 203, 59);
        p.block_q = Br, p.block_kv = Bc;
        check_against_reference(omp_backend(), p);
        p.causal = true;
        check_against_reference(omp_backend(), p);
    }
}

TEST_CASE("omp: the cache-sized tiles fit a core's 1 MiB L2 for every d, the plan within N") {
    for (std::int64_t d : {1, 3, 59, 64, 111, 128, 256}) {
        const BlockSizes b = omp_cache_blocks(d);
        const OmpPlan plan = omp_plan(make_problem(1, 1, 1, 1 << 14, 1 << 14, d));
        INFO("d = " << d << ": Br = " << b.Br << ", Bc = " << b.Bc << ", "
                    << plan.thread_floats << " floats per thread");
        CHECK(b.Br % 48 == 0);  // whole 6-row groups (cpu/tile_products.hpp)
        CHECK(b.Bc % 16 == 0);
        CHECK((b.Br >= 96 && b.Bc >= 16));  // each K_j, V_j value serves at least 96 rows
        CHECK(plan.blocks.Br <= b.Br);  // lower only to give every thread work
        CHECK(plan.thread_floats * sizeof(float) <= (std::size_t{1} << 20));
    }
    const OmpPlan small = omp_plan(make_problem(1, 1, 1, 7, 113, 64));
    CHECK(small.blocks.Br == 7);  // no buffer rows for query rows that do not exist
    CHECK(small.Tr == 1);
    AttentionProblem asked = make_problem(1, 1, 1, 100, 100, 8);
    asked.block_q = 3, asked.block_kv = 5;
    CHECK(omp_plan(asked).blocks.Br == 3);
    CHECK(omp_plan(asked).blocks.Bc == 5);
    asked.block_q = asked.block_kv = std::int64_t{1} << 40;  // beyond N: one tile, N rows
    CHECK(omp_plan(asked).blocks.Br == 100);
    CHECK(omp_plan(asked).Tc == 1);
}

TEST_CASE("omp: output and LSE are bitwise identical for 1, 2, 3 and 4 threads") {
    std::vector<AttentionProblem> problems = {make_problem(2, 3, 3, 300, 517, 64),
                                              make_problem(1, 1, 1, 7, 11, 5),  // one work item
                                              make_problem(2, 6, 2, 333, 200, 37)};
    problems[2].causal = true;
    problems[2].scale = 0.7f;
    std::vector<std::uint8_t> mask(tile_count(300, 17) * tile_count(517, 23));
    std::mt19937 gen(Catch::rngSeed() + 11);
    for (auto& m : mask) m = gen() % 2;
    AttentionProblem masked = make_problem(1, 2, 1, 300, 517, 48);
    masked.block_mask = {mask.data(), 17, 23};
    problems.push_back(masked);
    AttentionProblem small_tiles = make_problem(1, 3, 3, 203, 113, 59);  // 41 x 17 tiles per head
    small_tiles.block_q = 5, small_tiles.block_kv = 7;
    problems.push_back(small_tiles);

    for (const AttentionProblem& p : problems) {
        INFO(test::describe(p));
        const ProblemData in = random_problem_data(p, test::next_seed());
        test::Outputs one;
        {
            ThreadCount scope(1);
            one = run_poisoned(omp_backend(), p, in);
        }
        for (int threads : {2, 3, 4}) {
            ThreadCount scope(threads);
            const test::Outputs many = run_poisoned(omp_backend(), p, in);
            INFO("threads = " << threads);
            CHECK(std::memcmp(one.O.data(), many.O.data(), one.O.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(one.lse.data(), many.lse.data(), one.lse.size() * sizeof(float)) ==
                  0);
        }
    }
}

TEST_CASE("omp: bottom-right causal both ways, and fully masked rows give O = 0 and LSE = -inf") {
    ThreadCount scope(2);
    for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 300}, {300, 1}, {7, 203}, {203, 7}, {129, 129}, {200, 333}, {333, 200}}) {
        AttentionProblem p = make_problem(2, 3, 3, Nq, Nkv, 40);
        p.causal = true;
        check_against_reference(omp_backend(), p);
        // Query rows i < N_q - N_kv see no key at all (several whole query tiles when N_q >> N_kv).
        const ProblemData in = random_problem_data(p, test::next_seed());
        const test::Outputs out = run_poisoned(omp_backend(), p, in);
        const std::int64_t masked_rows = std::max<std::int64_t>(0, Nq - Nkv);
        INFO(test::describe(p) << ": " << masked_rows << " fully masked rows per head");
        for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh)
            for (std::int64_t i = 0; i < Nq; ++i) {
                const float lse = out.lse[bh * Nq + i];
                bool row_zero = true;
                for (std::int64_t k = 0; k < p.dim; ++k)
                    row_zero = row_zero && out.O[(bh * Nq + i) * p.dim + k] == 0.0f;
                if (i < masked_rows) {
                    CHECK(row_zero);
                    CHECK(lse == -INFINITY);
                } else {
                    CHECK(std::isfinite(lse));
                }
            }
    }
}

TEST_CASE("omp: scale, GQA ratios 2 and 3, MQA (ratio H), with and without causal") {
    ThreadCount scope(2);
    for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 113}, {113, 1}, {7, 203}, {203, 7}, {113, 113}, {203, 313}})
        for (bool causal : {false, true})
            for (std::int64_t Hkv : {6, 3, 2, 1}) {  // MHA, GQA ratios 2 and 3, MQA
                AttentionProblem p = make_problem(2, 6, Hkv, Nq, Nkv, 37);
                p.causal = causal;
                p.scale = 0.3f;
                check_against_reference(omp_backend(), p);
            }
}

TEST_CASE("omp: large logits (|scale q.k| up to ~1e4) stay finite and accurate") {
    ThreadCount scope(2);
    for (float scale : {40.0f, 300.0f}) {
        AttentionProblem p = make_problem(1, 2, 2, 203, 313, 64);
        p.scale = scale;
        check_against_reference(omp_backend(), p);
        p.causal = true;
        check_against_reference(omp_backend(), p);
    }
}

TEST_CASE("omp: random block masks with empty block rows, aligned with the tiles or not") {
    ThreadCount scope(2);
    std::mt19937 gen(Catch::rngSeed() + 5);
    for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 113}, {113, 1}, {7, 203}, {203, 7}, {300, 517}, {517, 300}})
        for (bool causal : {false, true})
            for (bool own_tiles : {false, true}) {
                // own_tiles: omp's cache-sized tiles, which straddle the mask blocks; otherwise the
                // tiles are the mask blocks (as `flashattn run --block-mask` gives them).
                AttentionProblem p = make_problem(1, 2, 1, Nq, Nkv, 19);
                p.causal = causal;
                const std::int64_t bq = 1 + gen() % 40, bkv = 1 + gen() % 40;
                std::vector<std::uint8_t> mask(tile_count(Nq, bq) * tile_count(Nkv, bkv));
                for (auto& m : mask) m = gen() % 2;
                if (mask.size() > 1)
                    std::fill_n(mask.begin(), tile_count(Nkv, bkv), 0);  // empty row
                p.block_mask = {mask.data(), bq, bkv};
                if (!own_tiles) p.block_q = bq, p.block_kv = bkv;
                check_against_reference(omp_backend(), p);
                // A query row in an empty block row sees no key: O = 0, LSE = -inf.
                const test::Outputs out =
                    run_poisoned(omp_backend(), p, random_problem_data(p, test::next_seed()));
                if (mask.size() > 1)
                    for (std::int64_t i = 0; i < std::min(bq, Nq); ++i) {
                        CHECK(out.lse[i] == -INFINITY);
                        CHECK(out.O[i * p.dim] == 0.0f);
                    }
            }
}

TEST_CASE("omp: f16 and bf16 inputs follow the 2x rule against standard in that precision") {
    ThreadCount scope(2);
    for (DType t : {DType::f16, DType::bf16})
        check_against_reference(omp_backend(), make_problem(2, 2, 1, 203, 113, 64), t);
}

TEST_CASE("omp: a NaN reaches exactly the rows that attend it, also through masked tiles") {
    ThreadCount scope(2);
    // Causal, N_q < N_kv: query row i sees keys j <= i + 100. Several tiles, partial and full.
    AttentionProblem p = make_problem(1, 2, 1, 150, 250, 24);
    p.causal = true;
    const ProblemData clean = random_problem_data(p, test::next_seed());
    const test::Outputs base = run_poisoned(omp_backend(), p, clean);
    const std::int64_t off = p.causal_offset(), d = p.dim;

    struct Poison {
        const char* what;
        char tensor;       // 'Q' (a row of head 0), 'K' or 'V' (a row of the one K/V head)
        std::int64_t row;  // the poisoned row
        float value;
    };
    for (const Poison& poison :
         {Poison{"NaN in V", 'V', 170, NAN}, Poison{"inf in V", 'V', 137, INFINITY},
          Poison{"NaN in K", 'K', 201, NAN}, Poison{"NaN in Q", 'Q', 77, NAN},
          Poison{"NaN in V, last key", 'V', 249, NAN}}) {
        INFO(poison.what << " at row " << poison.row);
        ProblemData in = clean;
        std::vector<float>& tensor = poison.tensor == 'Q'   ? in.Q
                                     : poison.tensor == 'K' ? in.K
                                                            : in.V;
        tensor[poison.row * d + 5] = poison.value;
        const test::Outputs out = run_poisoned(omp_backend(), p, in);
        for (std::int64_t h = 0; h < p.heads; ++h)
            for (std::int64_t i = 0; i < p.seq_q; ++i) {
                // Both heads share K/V head 0 (MQA); only head 0 has the poisoned query row.
                const bool hit =
                    poison.tensor == 'Q' ? (h == 0 && i == poison.row) : poison.row <= i + off;
                const float* row = &out.O[(h * p.seq_q + i) * d];
                const float* ref = &base.O[(h * p.seq_q + i) * d];
                bool any_nan = false, same = true;
                for (std::int64_t k = 0; k < d; ++k) {
                    any_nan = any_nan || std::isnan(row[k]);
                    same = same && same_values(row[k], ref[k]);
                }
                INFO("head " << h << ", row " << i);
                bool all_finite = true;
                for (std::int64_t k = 0; k < d; ++k)
                    all_finite = all_finite && std::isfinite(row[k]);
                if (hit) {
                    CHECK((std::isnan(poison.value) ? any_nan : !all_finite));
                } else {
                    CHECK(same);  // a masked key is absent: the row is as without the poison
                    CHECK(same_values(out.lse[h * p.seq_q + i], base.lse[h * p.seq_q + i]));
                }
            }
    }
}
