// tests/test_cuda_fa3.cpp — cuda-fa3 (FlashAttention-3's ideas on Hopper: wgmma, TMA, warp
// specialization) against
// float64 standard attention by the 2x rule, as cuda-tc is checked (tests/test_cuda_tc.cpp): the
// yardstick is float32 standard attention on the inputs rounded to fp16 / bf16. Exits 77 without a
// CUDA device; without cuda-fa3 (a build without sm_90a, or a GPU that is not compute capability
// 9.0) every case says so and checks nothing else.
#include "catch.hpp"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/registry.hpp"
#include "common/tiling.hpp"
#include "cuda/host/prepared.hpp"
#include "helpers.hpp"

using namespace flashattn;
using flashattn::test::check_against_reference;

namespace {

const std::vector<DType> kDtypes = {DType::f16, DType::bf16};

}  // namespace

TEST_CASE("cuda-fa3 matches float64 attention by the 2x rule on odd shapes") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (DType dtype : kDtypes)
        for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                 {1, 1}, {1, 203}, {7, 113}, {113, 7}, {113, 113}, {203, 1023}, {1023, 203}, {2047, 2047}})
            for (bool causal : {false, true})
                for (std::int64_t d : {64, 128, 256})
                    check_against_reference(*b, test::make_problem(2, 3, 3, Nq, Nkv, d, causal), dtype);
}

TEST_CASE("cuda-fa3: every compiled tile shape on ragged shapes") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (const char* variant : {"d64-Bc128", "d64-Bc128-pingpong", "d64-Br192-Bc128",
                                "d64-Bc128-s4-pingpong", "d128-Bc128-pingpong", "d128-Bc128",
                                "d128-Bc128-s3-pingpong",
                                "d256-Bc64-pingpong", "d256-Bc64", "d256-Bc80",
                                "d256-Bc80-pingpong"}) {
        INFO("FLASHATTN_VARIANT=cuda-fa3=" << variant);
        test::ScopedEnv env("FLASHATTN_VARIANT");
        env.set(std::string("cuda-fa3=") + variant);
        const std::int64_t d = std::stoll(std::string(variant).substr(1));  // "d64-..." -> 64
        for (bool causal : {false, true}) {
            check_against_reference(*b, test::make_problem(1, 2, 1, 333, 517, d, causal), DType::f16);
            check_against_reference(*b, test::make_problem(2, 2, 2, 130, 129, d, causal), DType::bf16);
        }
        // A block mask (the warpgroups' own skip-or-mask path), with a row of blocks that sees
        // nothing, on rows that end inside a warpgroup.
        AttentionProblem p = test::make_problem(1, 2, 1, 333, 271, d, true);
        const std::int64_t bq = 37, bkv = 53;
        const std::int64_t Tr = tile_count(p.seq_q, bq), Tc = tile_count(p.seq_kv, bkv);
        std::vector<std::uint8_t> mask(Tr * Tc);
        for (std::int64_t e = 0; e < Tr * Tc; ++e) mask[e] = (e * 7 + 3) % 5 != 0;
        std::fill_n(mask.begin() + 4 * Tc, Tc, 0);
        p.block_mask = {mask.data(), bq, bkv};
        check_against_reference(*b, p, DType::f16);
    }
    test::ScopedEnv env("FLASHATTN_VARIANT");
    env.set("cuda-fa3=d128-Bc128-pingpong");
    const float x[64] = {};
    CHECK_THROWS_WITH(b->prepare(test::make_problem(1, 1, 1, 1, 1, 64), x, x, x, DType::f16),
                      Catch::Contains("another head dim"));
    env.set("cuda-fa3=Bc96");
    CHECK_THROWS_WITH(b->prepare(test::make_problem(1, 1, 1, 1, 1, 64), x, x, x, DType::f16),
                      Catch::Contains("Bc96"));
}

TEST_CASE("cuda-fa3: GQA and MQA, any scale, block masks with an empty row") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    std::mt19937 gen(Catch::rngSeed() + 47);
    for (DType dtype : kDtypes) {
        for (std::int64_t Hkv : {3, 2, 1})
            for (bool causal : {false, true})
                for (std::int64_t d : {64, 128, 256})
                    check_against_reference(*b, test::make_problem(2, 6, Hkv, 157, 331, d, causal), dtype);
        for (float scale : {0.0f, 0.05f, -0.6f, 2.5f}) {
            AttentionProblem p = test::make_problem(1, 2, 1, 300, 211, scale < 0 ? 128 : 64, true);
            p.scale = scale;
            check_against_reference(*b, p, dtype);
        }
        for (bool causal : {false, true}) {
            AttentionProblem p = test::make_problem(1, 4, 2, 347, 401, causal ? 128 : 64, causal);
            const std::int64_t bq = 1 + gen() % 100, bkv = 1 + gen() % 100;
            const std::int64_t Tr = tile_count(p.seq_q, bq), Tc = tile_count(p.seq_kv, bkv);
            std::vector<std::uint8_t> mask(Tr * Tc);
            for (auto& m : mask) m = gen() % 3 != 0;
            std::fill_n(mask.begin() + (gen() % Tr) * Tc, Tc, 0);  // a row of blocks sees nothing
            p.block_mask = {mask.data(), bq, bkv};
            check_against_reference(*b, p, dtype);
        }
    }
}

// The default tile follows the problem's size (default_variant in cuda/fa3/backend.cu): at d = 64
// 128-row tiles with ping-pong where those fill at most two waves of the device's SMs and 192 rows
// beyond; at d = 128 three K/V slots for the prepared call's float32 O (never staged) without a
// block mask, two with one; at d = 256 Bc = 64 up to N_kv = 2048, causal or not, else Bc = 80; a
// split launch (decoding) at d = 64 the same tile with a deeper ring, at d = 128 two slots. Each
// side of every threshold, the name read from the prepared call's description, each result
// against float64.
TEST_CASE("cuda-fa3: the default tile follows the problem's size") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    const std::int64_t sms = cuda::device_limits().sm_count;
    const std::int64_t two_waves_heads = sms / 4;  // x 8 tiles of 128 rows (N_q = 1000) <= 2 sms
    struct Case {
        AttentionProblem p;
        const char* variant;
    };
    AttentionProblem masked = test::make_problem(1, 2, 1, 301, 517, 128, false);
    const std::int64_t bq = 64, bkv = 100;
    std::vector<std::uint8_t> mask(tile_count(masked.seq_q, bq) * tile_count(masked.seq_kv, bkv));
    for (std::size_t e = 0; e < mask.size(); ++e) mask[e] = e % 3 != 1;
    masked.block_mask = {mask.data(), bq, bkv};
    for (const Case& c : std::vector<Case>{
             {test::make_problem(1, two_waves_heads, 1, 1000, 301, 64, true), "d64-Bc128-pingpong"},
             {test::make_problem(1, two_waves_heads + 1, 1, 1000, 301, 64, true), "d64-Br192-Bc128"},
             {test::make_problem(1, 2, 1, 301, 517, 128, false), "d128-Bc128-s3-pingpong"},
             {test::make_problem(1, 2, 1, 301, 517, 128, true), "d128-Bc128-s3-pingpong"},
             {masked, "d128-Bc128-pingpong"},
             {test::make_problem(1, 2, 1, 97, 2048, 256, true), "d256-Bc64"},
             {test::make_problem(1, 2, 1, 97, 2049, 256, true), "d256-Bc80"},
             {test::make_problem(1, 2, 1, 97, 2048, 256, false), "d256-Bc64"},
             {test::make_problem(1, 2, 1, 97, 2049, 256, false), "d256-Bc80"},
             // Decoding: split-KV, and at d = 64 the deeper ring (split_variant).
             {test::make_problem(1, 8, 2, 1, 4099, 64, false), "d64-Bc128-s4-pingpong"},
             {test::make_problem(1, 8, 2, 4, 4099, 128, true), "d128-Bc128-pingpong"}}) {
        INFO(test::describe(c.p));
        const ProblemData in = random_problem_data(c.p, test::next_seed());
        const std::string tiles =
            b->prepare(c.p, in.Q.data(), in.K.data(), in.V.data(), DType::bf16)->tiles();
        CHECK(tiles.rfind(std::string(c.variant) + ":", 0) == 0);
        check_against_reference(*b, c.p, DType::bf16);
    }
}

// The persistent grid has one CTA per SM (132 on an H100): these problems have several hundred
// work tiles, so every CTA takes several, one after another, through the counter in device memory.
TEST_CASE("cuda-fa3: more work tiles than SMs, each CTA taking several in turn") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    std::mt19937 gen(Catch::rngSeed() + 53);
    for (std::int64_t d : {64, 128, 256})
        for (bool causal : {false, true}) {
            // 3 x 8 heads x 9 query tiles = 216 work tiles; N_q > N_kv: under the causal mask the
            // first query rows see no key.
            check_against_reference(*b, test::make_problem(3, 8, 2, 1100, 901, d, causal), DType::f16);
            AttentionProblem p = test::make_problem(2, 12, 4, 700, 1250, d, causal);  // 144 tiles
            const std::int64_t bq = 64 + gen() % 100, bkv = 32 + gen() % 100;
            const std::int64_t Tr = tile_count(p.seq_q, bq), Tc = tile_count(p.seq_kv, bkv);
            std::vector<std::uint8_t> mask(Tr * Tc);
            for (auto& m : mask) m = gen() % 4 != 0;
            p.block_mask = {mask.data(), bq, bkv};
            check_against_reference(*b, p, DType::bf16);
        }
}

// Under a causal mask the work tiles are numbered by scheduled_tile (common/tiling.hpp): a head's
// query tiles side by side, then the last heads' tiles longest first across them. 96 heads of 3
// or 4 query tiles are more than the tail of about two waves (88 or 66 heads on an H100), so both
// parts of the order run, with the counter.
TEST_CASE("cuda-fa3: the causal schedule, heads side by side and the last heads longest first") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (std::int64_t d : {64, 128, 256}) {
        const AttentionProblem p = test::make_problem(2, 48, 12, 400, 300, d, true);
        check_against_reference(*b, p, d == 128 ? DType::bf16 : DType::f16);
    }
}

// Under a causal mask whole warpgroups of the short query tile's missing rows go below row 0
// (query_tile_shift, common/tiling.hpp): the first work tile of a head holds rows below 0, read
// as zeros, skipped and never stored, and the last tile may still end past N_q. Shifts of 0, 64
// and 128 rows across the tiles (192 rows: N_q = 1000 -> 128, 65 -> 64; 128 rows: 900 and 130 ->
// 64), with N_kv > N_q (the diagonal then lets rows below 0 see keys) and N_kv < N_q.
TEST_CASE("cuda-fa3: under a causal mask the short query tile comes first, its rows below 0 unwritten") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (const char* variant : {"d64-Br192-Bc128", "d64-Bc128-pingpong", "d128-Bc128-pingpong",
                                "d256-Bc64"}) {
        INFO("FLASHATTN_VARIANT=cuda-fa3=" << variant);
        test::ScopedEnv env("FLASHATTN_VARIANT");
        env.set(std::string("cuda-fa3=") + variant);
        const std::int64_t d = std::stoll(std::string(variant).substr(1));
        for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
                 {1000, 1000}, {1000, 1301}, {1000, 777}, {65, 65}, {900, 900}, {130, 400}})
            check_against_reference(*b, test::make_problem(1, 3, 1, Nq, Nkv, d, true), DType::f16);
    }
}

// cuda-fa3 keeps a row's reference maximum while a key tile exceeds it by at most 2^8 (at d = 256;
// keeps_reference_max) and moves it only beyond: on rows whose maximum climbs, jumps and drops
// (climbing_maximum_data, tests/helpers.hpp) every tile must still match float64 by the 2x rule.
TEST_CASE("cuda-fa3: a row maximum that climbs, jumps and drops across key tiles") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (const char* variant : {"d64-Br192-Bc128", "d64-Bc128-pingpong", "d128-Bc128-pingpong",
                                "d256-Bc64", "d256-Bc80"}) {
        INFO("FLASHATTN_VARIANT=cuda-fa3=" << variant);
        test::ScopedEnv env("FLASHATTN_VARIANT");
        env.set(std::string("cuda-fa3=") + variant);
        const std::int64_t d = std::stoll(std::string(variant).substr(1));
        for (DType dtype : kDtypes)
            for (bool causal : {false, true}) {
                const AttentionProblem p = test::make_problem(1, 2, 1, 150, 611, d, causal);
                const std::uint64_t seed = test::next_seed();
                INFO("seed=" << seed);
                check_against_reference(*b, p, test::climbing_maximum_data(p, seed), dtype);
            }
    }
}

TEST_CASE("cuda-fa3: repeated runs give bit-identical outputs (whichever CTA takes a tile)") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    for (std::int64_t d : {64, 128, 256}) {
        const AttentionProblem p = test::make_problem(2, 16, 4, 1023, 1111, d, true);
        test::check_identical_runs(*b, p, random_problem_data(p, test::next_seed()), DType::f16);
    }
}

TEST_CASE("cuda-fa3 refuses what it cannot run, naming the field") {
    const Backend* b = test::cuda_fa3_or_warn();
    if (!b) return;
    const float x[512] = {};
    for (std::int64_t d : {32, 96, 192, 512})
        CHECK_THROWS_WITH(b->prepare(test::make_problem(1, 1, 1, 1, 1, d), x, x, x, DType::f16),
                          Catch::Contains("dim = " + std::to_string(d)));
    CHECK_THROWS_WITH(b->prepare(test::make_problem(1, 1, 1, 1, 1, 64), x, x, x, DType::f32),
                      Catch::Contains("dtype = f32"));
}
