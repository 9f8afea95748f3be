// tests/test_cuda_fa3_backward.cpp — cuda-fa3's backward (wgmma, Hopper) against the float64
// backward reference by the 2x rule, as cuda-tc's backward is checked
// (tests/test_cuda_tc_backward.cpp, whose opening comment states the rule): fresh random inputs,
// poisoned outputs, shapes that are not multiples of its tiles (Br = 64, 80 or 128 queries, Bc = 128
// keys, 64 keys per warpgroup; at d = 256 Bc = 64, the warpgroups splitting d). Exits 77 without a CUDA device; without cuda-fa3 (a build without
// sm_90a, or a GPU that is not compute capability 9.0) every case says so and checks nothing else.
#include "catch.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/registry.hpp"
#include "common/tiling.hpp"
#include "helpers.hpp"

using namespace flashattn;
using flashattn::test::check_backward_against_reference;

namespace {

const std::vector<DType> kDtypes = {DType::f16, DType::bf16};

// The backward's compiled tiles, as FLASHATTN_VARIANT=cuda-fa3-backward=<name> picks them; each
// name starts with its head dim ("d<dim>-...").
const char* const kTiles[] = {"d64-Br128-ring3",
                              "d64-Br128",
                              "d64-Br128-producer",
                              "d64-Br64",
                              "d128-Br64-dq-overlap",
                              "d128-Br64-dq-overlap-producer",
                              "d128-Br80-dq-overlap-producer",
                              "d128-Br64",
                              "d256-Br64"};

// check(d) under FLASHATTN_VARIANT=cuda-fa3-backward=<tile>, for every compiled tile.
template <class Check>
void for_each_tile(Check check) {
    for (const char* variant : kTiles) {
        INFO("FLASHATTN_VARIANT=cuda-fa3-backward=" << variant);
        const test::ScopedEnv env("FLASHATTN_VARIANT");
        env.set(std::string("cuda-fa3-backward=") + variant);
        check(std::int64_t{std::stoi(variant + 1)});  // "d<dim>-..."
    }
}

// The deterministic kernel on p: the gradients by the 2x rule against float64, then the same bits
// from a second run.
void check_deterministic_twice(const Backend& b, const AttentionProblem& p, DType dtype) {
    const test::ScopedEnv deterministic("FLASHATTN_DETERMINISTIC");
    deterministic.set("1");
    const std::uint64_t seed = test::next_seed();
    const ProblemData in = random_problem_data(p, seed);
    const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
    const test::Gradients first = check_backward_against_reference(b, p, in, dO, dtype);
    const test::Gradients again = test::run_forward_backward(b, p, in, dO, dtype);
    CHECK(std::memcmp(first.dQ.data(), again.dQ.data(), first.dQ.size() * 4) == 0);
    CHECK(std::memcmp(first.dK.data(), again.dK.data(), first.dK.size() * 4) == 0);
    CHECK(std::memcmp(first.dV.data(), again.dV.data(), first.dV.size() * 4) == 0);
}

}  // namespace

TEST_CASE("cuda-fa3 backward matches float64 by the 2x rule on odd shapes") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    REQUIRE(b->has_backward());
    for (DType dtype : kDtypes)
        for (std::int64_t d : {64, 128, 256})
            for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                     {1, 1}, {1, 203}, {7, 113}, {113, 7}, {113, 113}, {203, 517}, {517, 203}})
                for (bool causal : {false, true})
                    check_backward_against_reference(*b, test::make_problem(2, 3, 3, Nq, Nkv, d, causal),
                                                     dtype);
}

TEST_CASE("cuda-fa3 backward: many tiles (N = 1023), GQA and MQA, any scale, long rows") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (DType dtype : kDtypes) {
        for (std::int64_t d : {64, 128, 256})
            for (bool causal : {false, true})
                check_backward_against_reference(*b, test::make_problem(1, 2, 1, 1023, 1023, d, causal),
                                                 dtype);
        for (std::int64_t Hkv : {3, 2, 1})  // dK and dV summed over groups of 2, 3 and 6 heads
            for (bool causal : {false, true})
                check_backward_against_reference(*b, test::make_problem(2, 6, Hkv, 37, 153, 64, causal),
                                                 dtype);
        check_backward_against_reference(*b, test::make_problem(2, 6, 2, 37, 153, 256, true), dtype);
        for (float scale : {0.0f, 0.05f, -0.6f, 1.5f}) {
            AttentionProblem p = test::make_problem(1, 2, 1, 157, 91, 64, true);
            p.scale = scale;
            check_backward_against_reference(*b, p, dtype);
        }
        check_backward_against_reference(*b, test::make_problem(1, 1, 1, 3, 1500, 128), dtype);
        check_backward_against_reference(*b, test::make_problem(1, 1, 1, 1500, 3, 64), dtype);
    }
}

TEST_CASE("cuda-fa3 backward: block masks, and a fully masked row gets zero gradients") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    std::mt19937 gen(Catch::rngSeed() + 47);
    for (DType dtype : kDtypes)
        for (bool causal : {false, true})
            for (int repeat = 0; repeat < 3; ++repeat) {
                AttentionProblem p =
                    test::make_problem(1, 4, 2, 147, 290, repeat == 2 ? 256 : 64, causal);
                const std::int64_t bq = 1 + gen() % 80, bkv = 1 + gen() % 80;
                const std::int64_t Tr = tile_count(p.seq_q, bq), Tc = tile_count(p.seq_kv, bkv);
                std::vector<std::uint8_t> mask(Tr * Tc);
                for (auto& m : mask) m = gen() % 3 != 0;
                const std::int64_t empty = gen() % Tr;  // one row of blocks sees nothing
                std::fill_n(mask.begin() + empty * Tc, Tc, 0);
                p.block_mask = {mask.data(), bq, bkv};
                const std::uint64_t seed = test::next_seed();
                const ProblemData in = random_problem_data(p, seed);
                const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
                const test::Gradients g = check_backward_against_reference(*b, p, in, dO, dtype);
                for (std::int64_t bh = 0; bh < p.heads; ++bh)
                    for (std::int64_t i = empty * bq; i < std::min(p.seq_q, (empty + 1) * bq); ++i)
                        for (std::int64_t k = 0; k < p.dim; ++k)
                            CHECK(g.dQ[(bh * p.seq_q + i) * p.dim + k] == 0.0f);
            }
    // Causal with N_q > N_kv: the first N_q - N_kv rows see no key at all.
    for (DType dtype : kDtypes)
        check_backward_against_reference(*b, test::make_problem(1, 2, 1, 131, 29, 128, true), dtype);
}

TEST_CASE("cuda-fa3 backward: FLASHATTN_DETERMINISTIC=1 gives the same bits on every run") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    const test::ScopedEnv deterministic("FLASHATTN_DETERMINISTIC");
    deterministic.set("1");
    std::vector<std::uint8_t> mask = {1, 0, 1, 1, 1, 0, 0, 1, 1};  // 3 x 3 blocks of 100 x 150
    for (DType dtype : kDtypes)
        for (int variant = 0; variant < 4; ++variant) {
            const std::int64_t d = variant == 0 ? 128 : variant == 3 ? 256 : 64;
            AttentionProblem p = test::make_problem(2, 4, 2, 300, 450, d, variant % 2 == 1);
            if (variant == 2) p.block_mask = {mask.data(), 100, 150};
            const std::uint64_t seed = test::next_seed();
            const ProblemData in = random_problem_data(p, seed);
            const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
            const test::Gradients first = check_backward_against_reference(*b, p, in, dO, dtype);
            for (int run = 0; run < 3; ++run) {
                const test::Gradients again = test::run_forward_backward(*b, p, in, dO, dtype);
                INFO(test::describe(p) << " " << to_string(dtype) << ", run " << run);
                CHECK(std::memcmp(first.dQ.data(), again.dQ.data(), first.dQ.size() * 4) == 0);
                CHECK(std::memcmp(first.dK.data(), again.dK.data(), first.dK.size() * 4) == 0);
                CHECK(std::memcmp(first.dV.data(), again.dV.data(), first.dV.size() * 4) == 0);
            }
        }
}

// Under a causal mask the CTAs run in scheduled_tile's order (common/tiling.hpp): a K/V head's key
// tiles side by side, then the last heads' key tiles longest first across them. 96 K/V heads of 3
// key tiles are more than the tail of about two waves (88 on an H100), so both parts run; in
// deterministic mode a key tile's dQ additions wait for the key tiles before it, which both parts
// start first.
TEST_CASE("cuda-fa3 backward: the causal schedule, heads side by side and the last longest first") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    const test::ScopedEnv deterministic("FLASHATTN_DETERMINISTIC");
    for (const char* mode : {"0", "1"}) {
        deterministic.set(mode);
        const AttentionProblem p = test::make_problem(2, 48, 48, 400, 300, 64, true);
        const std::uint64_t seed = test::next_seed();
        const ProblemData in = random_problem_data(p, seed);
        const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
        const test::Gradients first = check_backward_against_reference(*b, p, in, dO, DType::bf16);
        if (std::string(mode) == "1") {
            const test::Gradients again = test::run_forward_backward(*b, p, in, dO, DType::bf16);
            CHECK(std::memcmp(first.dQ.data(), again.dQ.data(), first.dQ.size() * 4) == 0);
        }
    }
}

TEST_CASE("cuda-fa3 backward: the default (unordered dQ) mode keeps dK, dV bits and dQ within the rule") {
    // As cuda-tc's: dQ's fp32 additions (TMA reduce-adds of the key tiles' blocks) may come in
    // another order on every run; dK and dV are summed in registers in a fixed order.
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    const AttentionProblem p = test::make_problem(2, 4, 2, 300, 1000, 128, true);
    const std::uint64_t seed = test::next_seed();
    const ProblemData in = random_problem_data(p, seed);
    const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
    const test::Gradients first = check_backward_against_reference(*b, p, in, dO, DType::f16);
    double moved = 0;
    for (int run = 0; run < 3; ++run) {
        const test::Gradients again = check_backward_against_reference(*b, p, in, dO, DType::f16);
        CHECK(std::memcmp(first.dK.data(), again.dK.data(), first.dK.size() * 4) == 0);
        CHECK(std::memcmp(first.dV.data(), again.dV.data(), first.dV.size() * 4) == 0);
        for (std::size_t e = 0; e < first.dQ.size(); ++e)
            moved = std::max(moved, double(std::fabs(first.dQ[e] - again.dQ[e])));
    }
    WARN("largest run-to-run change of dQ: " << moved);
}

TEST_CASE("cuda-fa3 backward: a NaN reaches the gradients that read it, and at most its tile") {
    // N = 203, causal. A NaN in Q at row 57 makes P_57j and dS_57j NaN for every key j <= 57 the
    // row sees: dQ_57, and dK_j, dV_j for j <= 57; no other row of dQ reads Q_57. A warpgroup
    // multiplies 64 keys by a query tile of Br rows at once: where such a tile holds row 57 and is
    // partly visible, the masked dS_57j = 0 still meets Q_57 in the tensor-core product, so dK_j
    // may be NaN for j < Br (Br = 128 at d = 64: keys 64..127 see rows 64..127 of that tile);
    // keys from 128 on must not be.
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (DType dtype : kDtypes) {
        const AttentionProblem p = test::make_problem(1, 1, 1, 203, 203, 64, true);
        const std::uint64_t seed = test::next_seed();
        ProblemData in = random_problem_data(p, seed);
        const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
        in.Q[57 * p.dim + 3] = std::numeric_limits<float>::quiet_NaN();
        const test::Gradients g = test::run_forward_backward(*b, p, in, dO, dtype);
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
            INFO("dQ row " << i);
            CHECK(test::row_has_nan(g.dQ, i, p.dim) == (i == 57));
        }
        for (std::int64_t j = 0; j < p.seq_kv; ++j) {
            INFO("key " << j);
            if (j <= 57) CHECK(test::row_has_nan(g.dK, j, p.dim));
            if (j >= 128) CHECK_FALSE(test::row_has_nan(g.dK, j, p.dim));
            CHECK(test::row_has_nan(g.dV, j, p.dim) == (j <= 57));  // P = 0 meets a finite dO
        }
    }
}

TEST_CASE("cuda-fa3 backward rejects what it cannot run, naming the field") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    const AttentionProblem p = test::make_problem(1, 1, 1, 5, 5, 32);
    const ProblemData in = random_problem_data(p, 1);
    const std::vector<float> dO(p.q_elements(), 1.0f), O(p.q_elements()), lse(p.lse_elements());
    std::vector<float> dQ(p.q_elements()), dK(p.kv_elements()), dV(p.kv_elements());
    BackwardInputs bin{in.Q.data(), in.K.data(), in.V.data(), O.data(), lse.data(), dO.data()};
    CHECK_THROWS_WITH(run_backward(*b, p, bin, dQ.data(), dK.data(), dV.data(), DType::f16),
                      Catch::Contains("dim = 32"));
    const AttentionProblem p64 = test::make_problem(1, 1, 1, 4, 4, 64);
    const ProblemData in64 = random_problem_data(p64, 2);
    bin = {in64.Q.data(), in64.K.data(), in64.V.data(), O.data(), lse.data(), dO.data()};
    CHECK_THROWS_WITH(run_backward(*b, p64, bin, dQ.data(), dK.data(), dV.data(), DType::f32),
                      Catch::Contains("dtype = f32"));
    bin.dO = nullptr;
    CHECK_THROWS_WITH(run_backward(*b, p64, bin, dQ.data(), dK.data(), dV.data(), DType::f16),
                      Catch::Contains("dO = null"));
}

TEST_CASE("cuda-fa3 backward: every compiled tile passes the rule") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for_each_tile([&](std::int64_t d) {
        for (bool causal : {false, true}) {
            check_backward_against_reference(*b, test::make_problem(1, 2, 1, 301, 257, d, causal),
                                             DType::f16);
            check_backward_against_reference(*b, test::make_problem(2, 2, 2, 130, 129, d, causal),
                                             DType::bf16);
        }
        // N_kv a multiple of every Bc (the 80-row tile's kernel that masks no key), N_q of no Br.
        check_backward_against_reference(*b, test::make_problem(2, 3, 1, 203, 384, d, false),
                                         DType::bf16);
        // Every score near -128 .. -144 (L_i < -88) and N_kv of no Bc: unmasked, a key past N_kv
        // (a zero K_j row, S = 0) gives P = e^(-L_i) = inf and dQ NaN, so the keys past N_kv must
        // be masked (the 80-row tile's ScoreMask::keys_past_end). test::low_score_data says more.
        {
            AttentionProblem p = test::make_problem(1, 2, 1, 150, 200, d, false);
            p.scale = 1.0f;
            const std::uint64_t seed = test::next_seed();
            INFO("seed=" << seed);
            check_backward_against_reference(*b, p, test::low_score_data(p, seed),
                                             random_normal(p.q_elements(), seed + 3), DType::f16);
        }
        // Many steps per CTA (four query heads of 12 to 24 query tiles each): the ring of Q_i,
        // dO_i and, with a producer, dS^T's two buffers come round again and again.
        check_backward_against_reference(*b, test::make_problem(1, 4, 1, 1500, 200, d, false),
                                         DType::f16);
        // Each tile's block-mask kernel, and its deterministic kernel: the same bits twice.
        std::vector<std::uint8_t> mask = {1, 0, 1, 1, 1, 0, 0, 0, 0};  // 3 x 3 blocks, row 2 empty
        AttentionProblem masked = test::make_problem(1, 2, 1, 203, 300, d, true);
        masked.block_mask = {mask.data(), 70, 100};
        check_backward_against_reference(*b, masked, DType::f16);
        check_deterministic_twice(*b, test::make_problem(1, 4, 2, 301, 257, d, true), DType::bf16);
    });
}

// More CTAs than the GPU runs at once: 12 K/V heads of 25 key tiles (49 at d = 256) are 300 CTAs
// or more, three waves and more on any Hopper GPU, in scheduled_tile's order (under the causal
// mask both of its parts). Every compiled tile, with each of its kernels (plain, block mask,
// deterministic).
TEST_CASE("cuda-fa3 backward: several waves of CTAs, every compiled tile and kernel") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for_each_tile([&](std::int64_t d) {
        check_backward_against_reference(*b, test::make_problem(3, 8, 4, 90, 3100, d, true),
                                         DType::f16);
        check_backward_against_reference(*b, test::make_problem(3, 8, 4, 90, 3100, d, false),
                                         DType::bf16);
        std::vector<std::uint8_t> mask = {1, 0, 1, 0, 1, 1};  // 2 x 3 blocks of 45 x 1100
        AttentionProblem masked = test::make_problem(3, 8, 4, 90, 3100, d, false);
        masked.block_mask = {mask.data(), 45, 1100};
        check_backward_against_reference(*b, masked, DType::f16);
        check_deterministic_twice(*b, test::make_problem(3, 8, 4, 90, 3100, d, true), DType::bf16);
    });
}
