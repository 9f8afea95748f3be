// tests/test_cuda_tc.cpp — cuda-tc (FlashAttention-2 on tensor cores, fp16/bf16) against float64
// standard attention. Exits 77 (CTest's "skipped") when no CUDA device is present.
//
// The rule (docs/design.md, Correctness rule; FlashAttention's own tests): with ref64 = float64 standard attention on the
// ORIGINAL float inputs, and std_p = float32 standard attention (CPU) on the inputs ROUNDED to
// fp16 / bf16 -- the precision cuda-tc is handed --
//     max|O_tc - ref64| <= 2 max|std_p - ref64| + 1e-6,   and the same for LSE.
// So cuda-tc may lose at most as much again as rounding the inputs already costs; rounding P~ to
// 16 bits for the second product is the extra error it has to fit into that budget.
// check_against_reference (tests/helpers.hpp) applies it, with fresh random inputs per call and
// poisoned outputs (the backend also fills its device outputs with NaN before every run).
#include "catch.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/tiling.hpp"
#include "cuda/backends.hpp"
#include "cuda/tc/backend.hpp"
#include "helpers.hpp"

using namespace flashattn;
using flashattn::test::check_against_reference;
using flashattn::test::run_poisoned;

namespace {

const std::vector<DType> kDtypes = {DType::f16, DType::bf16};

// (N_q, N_kv): equal, N_q < N_kv and N_q > N_kv; none a multiple of any tile size.
const std::vector<std::pair<std::int64_t, std::int64_t>> kSeqPairs = {
    {1, 1}, {1, 203}, {7, 113}, {113, 7}, {113, 113}, {203, 1023}, {1023, 203}};

}  // namespace

TEST_CASE("cuda-tc matches float64 attention by the 2x rule on odd shapes, every head dim") {
    const Backend backend = tc::tc_backend();
    for (DType dtype : kDtypes)
        for (std::int64_t d : tc::tc_head_dims())
            for (auto [Nq, Nkv] : kSeqPairs)
                for (bool causal : {false, true}) {
                    const bool big = Nq * Nkv * d > 10'000'000;
                    check_against_reference(
                        backend, test::make_problem(big ? 1 : 2, big ? 2 : 3, big ? 2 : 3, Nq, Nkv, d, causal),
                        dtype);
                }
}

TEST_CASE("cuda-tc: many tiles in both directions (N = 1023 and 2047)") {
    const Backend backend = tc::tc_backend();
    for (DType dtype : kDtypes)
        for (std::int64_t d : {64, 128})
            for (bool causal : {false, true}) {
                check_against_reference(backend, test::make_problem(2, 2, 2, 1023, 1023, d, causal), dtype);
                check_against_reference(backend, test::make_problem(1, 1, 1, 2047, 2047, d, causal), dtype);
            }
}

TEST_CASE("cuda-tc: bottom-right causal both ways, GQA/MQA, and any scale") {
    const Backend backend = tc::tc_backend();
    for (DType dtype : kDtypes)
        for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                 {1, 113}, {113, 1}, {7, 203}, {203, 7}, {113, 1023}, {1023, 113}, {203, 203}})
            for (std::int64_t Hkv : {6, 3, 2, 1}) {  // MHA, GQA ratios 2 and 3, MQA
                AttentionProblem p = test::make_problem(2, 6, Hkv, Nq, Nkv, 64, true);
                p.scale = 0.3f;
                check_against_reference(backend, p, dtype);
            }
    // Negative, zero and large scales (|scale q.k| in the hundreds: exponents far from 0).
    for (DType dtype : kDtypes)
        for (float scale : {-0.2f, 0.0f, 8.0f})
            for (bool causal : {false, true}) {
                AttentionProblem p = test::make_problem(2, 2, 1, 203, 113, 128, causal);
                p.scale = scale;
                check_against_reference(backend, p, dtype);
            }
}

TEST_CASE("cuda-tc: block masks skip invisible tiles and mask partial ones") {
    const Backend backend = tc::tc_backend();
    std::mt19937 gen(Catch::rngSeed() + 11);
    for (DType dtype : kDtypes)
        for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                 {7, 203}, {203, 7}, {203, 203}, {1023, 517}})
            for (bool causal : {false, true})
                for (std::int64_t d : {64, 128}) {
                    AttentionProblem p = test::make_problem(1, 2, 1, Nq, Nkv, d, causal);
                    // Mask blocks that do not line up with the kernel's tiles, and ones that do.
                    const bool aligned = gen() % 3 == 0;
                    const std::int64_t bq = aligned ? 128 : 1 + gen() % 150;
                    const std::int64_t bkv = aligned ? 64 : 1 + gen() % 150;
                    std::vector<std::uint8_t> mask(tile_count(Nq, bq) * tile_count(Nkv, bkv));
                    for (auto& m : mask) m = gen() % 2;
                    std::fill_n(mask.begin(), tile_count(Nkv, bkv), 0);  // rows see nothing
                    p.block_mask = {mask.data(), bq, bkv};
                    check_against_reference(backend, p, dtype);
                }
}

TEST_CASE("cuda-tc: every compiled tile shape computes the same attention") {
    for (DType dtype : kDtypes)
        for (std::int64_t d : tc::tc_head_dims())
            for (const tc::TcTileShape& tile : tc::tc_tile_shapes(d, dtype)) {
                const test::ScopedEnv variant("FLASHATTN_VARIANT");
                variant.set("cuda-tc=" + tile.name());
                const Backend backend = tc::tc_backend();
                INFO("variant " << tile.name());
                check_against_reference(backend, test::make_problem(2, 2, 1, 203, 517, d, false), dtype);
                check_against_reference(backend, test::make_problem(1, 2, 2, 517, 517, d, true), dtype);
            }
}

// cuda-tc's forward keeps a row's reference maximum while a key tile exceeds it by at most 2^8 at
// d >= 128 (TcForwardOps::kLazyRescale; keeps_reference_max) and moves it only beyond: on rows
// whose maximum climbs, jumps and drops (climbing_maximum_data, tests/helpers.hpp) every tile of
// those head dims must still match float64 by the 2x rule, and d = 64 (Algorithm 1's update) too.
TEST_CASE("cuda-tc: a row maximum that climbs, jumps and drops across key tiles") {
    for (DType dtype : kDtypes)
        for (std::int64_t d : {64, 128, 256})
            for (const tc::TcTileShape& tile : tc::tc_tile_shapes(d, dtype)) {
                const test::ScopedEnv variant("FLASHATTN_VARIANT");
                variant.set("cuda-tc=" + tile.name());
                const Backend backend = tc::tc_backend();
                INFO("variant " << tile.name());
                for (bool causal : {false, true}) {
                    const AttentionProblem p = test::make_problem(1, 2, 1, 150, 611, d, causal);
                    const std::uint64_t seed = test::next_seed();
                    INFO("seed=" << seed);
                    check_against_reference(backend, p, test::climbing_maximum_data(p, seed), dtype);
                }
            }
}

TEST_CASE("cuda-tc: the decoding kernel at every head dim, split or not, causal, GQA") {
    // H = 8 over H_kv = 2: groups of 4 heads, packed into 4 N_q rows where the masks allow it
    // (cuda/tc/decode_kernel.cuh runs at most 16 rows per head); N_kv = 1000 is no multiple of
    // any key tile, and S = 5 leaves the chunks uneven.
    const Backend backend = tc::tc_backend();
    for (DType dtype : kDtypes)
        for (std::int64_t d : tc::tc_head_dims())
            for (std::int64_t Nq : {1, 4})
                for (bool causal : {false, true})
                    for (std::int64_t S : {0, 1, 5}) {
                        AttentionProblem p = test::make_problem(2, 8, 2, Nq, 1000, d, causal);
                        p.kv_splits = S;
                        INFO("d = " << d << ", N_q = " << Nq << ", causal " << causal << ", S = " << S);
                        REQUIRE(tc::tc_default_tile(p, dtype).decode);
                        check_against_reference(backend, p, dtype);
                    }
}

TEST_CASE("cuda-tc: decoding shapes get the decoding kernel, and only they") {
    for (DType dtype : kDtypes) {
        CHECK(tc::tc_decodes(test::make_problem(1, 32, 8, 1, 8192, 128, false)));   // 8 x 4 rows
        CHECK(tc::tc_decodes(test::make_problem(1, 32, 8, 4, 8192, 128, false)));   // 8 x 16 rows
        CHECK(tc::tc_decodes(test::make_problem(1, 32, 32, 16, 8192, 64, true)));   // 16 rows
        CHECK_FALSE(tc::tc_decodes(test::make_problem(1, 32, 8, 5, 8192, 128, false)));  // 20
        CHECK_FALSE(tc::tc_decodes(test::make_problem(1, 8, 8, 17, 8192, 64, false)));
        CHECK_FALSE(tc::tc_default_tile(test::make_problem(2, 4, 4, 1024, 1024, 64, true), dtype).decode);
        CHECK(tc::tc_default_tile(test::make_problem(2, 4, 4, 1, 1024, 64, true), dtype).decode);
    }
}

TEST_CASE("cuda-tc: repeated runs give bit-identical outputs (no race)") {
    const Backend backend = tc::tc_backend();
    for (DType dtype : kDtypes) {
        const AttentionProblem p = test::make_problem(2, 4, 2, 1023, 1111, 128, true);
        const ProblemData in = random_problem_data(p, flashattn::test::next_seed());
        const test::Outputs first = test::check_identical_runs(backend, p, in, dtype);
        // A second preparation (fresh device buffers) gives the same bits too.
        const test::Outputs again = run_poisoned(backend, p, in, dtype);
        CHECK(std::memcmp(again.O.data(), first.O.data(), first.O.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("cuda-tc: a NaN input makes exactly the rows that see it NaN") {
    const Backend backend = tc::tc_backend();
    for (DType dtype : kDtypes) {
        const AttentionProblem p = test::make_problem(1, 1, 1, 203, 203, 64, true);
        ProblemData in = random_problem_data(p, flashattn::test::next_seed());
        in.Q[57 * p.dim + 3] = std::numeric_limits<float>::quiet_NaN();   // query row 57
        in.K[150 * p.dim + 9] = std::numeric_limits<float>::quiet_NaN();  // key 150: rows >= 150
        const test::Outputs out = run_poisoned(backend, p, in, dtype);
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
            const bool expect_nan = i == 57 || i >= 150;
            bool any_nan = false;
            for (std::int64_t c = 0; c < p.dim; ++c) any_nan = any_nan || std::isnan(out.O[i * p.dim + c]);
            INFO("row " << i);
            CHECK(any_nan == expect_nan);
            CHECK(std::isnan(out.lse[i]) == expect_nan);
        }
    }
}

TEST_CASE("cuda-tc rejects what it cannot run with std::invalid_argument naming the field") {
    const Backend backend = tc::tc_backend();
    const float x[1] = {0.0f};
    for (std::int64_t d : {1, 3, 59, 80, 111, 192}) {
        const AttentionProblem p = test::make_problem(1, 1, 1, 1, 1, d);
        std::vector<float> q(d, 0.5f);
        try {
            backend.prepare(p, q.data(), q.data(), q.data(), DType::f16);
            FAIL("dim " << d << " accepted");
        } catch (const std::invalid_argument& e) {
            CHECK_THAT(e.what(), Catch::Contains("dim = " + std::to_string(d)));
            CHECK_THAT(e.what(), Catch::Contains("32, 64, 96, 128, 256"));
        }
    }
    CHECK_THROWS_AS(backend.prepare(test::make_problem(1, 1, 1, 1, 1, 64), x, x, x, DType::f32),
                    std::invalid_argument);
    CHECK_THROWS_AS(backend.prepare(test::make_problem(1, 4, 3, 1, 1, 64), x, x, x, DType::f16),
                    std::invalid_argument);  // heads_kv must divide heads
}

TEST_CASE("cuda-tc uploads exactly the values round_to_dtype gives") {
    std::mt19937 gen(Catch::rngSeed() + 3);
    std::vector<float> values = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65520.0f, 1e5f, -1e5f,
                                 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-10f,
                                 1.0009765625f, 1.00048828125f,  // an f16 tie (to even)
                                 1.00390625f, 1.001953125f,      // a bf16 tie
                                 3.4e38f, std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::denorm_min()};
    std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
    for (int k = 0; k < 100000; ++k)
        values.push_back((gen() % 2 ? 1.0f : -1.0f) * std::exp2(exponent(gen)));
    for (DType dtype : kDtypes) {
        std::size_t mismatches = 0;
        float first = 0;
        for (float x : values) {
            const float expected = round_to_dtype(x, dtype);
            const float uploaded = tc::from_bits(tc::to_bits(x, dtype), dtype);
            if (std::memcmp(&expected, &uploaded, 4) != 0 && mismatches++ == 0) first = x;
        }
        INFO(to_string(dtype) << ": first mismatch at x = " << first);
        CHECK(mismatches == 0);
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(std::isnan(tc::from_bits(tc::to_bits(nan, DType::f16), DType::f16)));
    CHECK(std::isnan(tc::from_bits(tc::to_bits(nan, DType::bf16), DType::bf16)));
}
