// tests/test_cpu_backends.cpp — standard (float) and scalar against float64 standard attention by
// the 2x rule, on shapes that are not multiples of any block size, with poisoned outputs and LSE.
#include <random>

#include "common/tiling.hpp"
#include "helpers.hpp"

using namespace flashattn;
using flashattn::test::check_against_reference;

TEST_CASE("standard float32 and scalar match float64 attention on the odd-shape grid") {
    const std::string name = GENERATE(as<std::string>{}, "standard", "scalar");
    const Backend& backend = find_backend(name);
    for (auto [Nq, Nkv] : test::kOddSeqPairs)
        for (std::int64_t d : test::kOddDims) {
            // Keep the largest problems to one (batch, head) pair; B*H > 1 everywhere else.
            const bool big = Nq * Nkv * d > 20'000'000;
            check_against_reference(
                backend, test::make_problem(big ? 1 : 2, big ? 1 : 3, big ? 1 : 3, Nq, Nkv, d));
        }
}

TEST_CASE("scalar: any block sizes, including 1 and larger than N, give the same attention") {
    const Backend& scalar = find_backend("scalar");
    for (auto [Br, Bc] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 7}, {5, 1}, {3, 5}, {16, 64}, {64, 16}, {2000, 2000}}) {
        AttentionProblem p = test::make_problem(2, 2, 2, 113, 203, 59);
        p.block_q = Br, p.block_kv = Bc;
        check_against_reference(scalar, p);
    }
}

TEST_CASE("scalar: block sizes derived from M by Algorithm 1 line 1") {
    const Backend& scalar = find_backend("scalar");
    for (std::int64_t M : {4 * 59, 1000, 4096, 16384, 100000}) {
        AttentionProblem p = test::make_problem(1, 2, 2, 203, 113, 59);
        p.sram_floats = M;
        check_against_reference(scalar, p);
    }
}

TEST_CASE("variants: scale, bottom-right causal, GQA/MQA and block masks on the CPU forms") {
    const std::string name = GENERATE(as<std::string>{}, "standard", "scalar");
    const Backend& backend = find_backend(name);
    std::mt19937 gen(Catch::rngSeed() + 5);
    for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 113}, {113, 1}, {7, 203}, {203, 7}, {113, 113}, {203, 113}}) {
        for (bool causal : {false, true})
            for (std::int64_t Hkv : {6, 3, 2, 1}) {  // MHA, GQA ratios 2 and 3, MQA
                AttentionProblem p = test::make_problem(2, 6, Hkv, Nq, Nkv, 37);
                p.causal = causal;
                p.scale = 0.3f;
                check_against_reference(backend, p);
            }
        // Random block masks (including all-zero rows of blocks), alone and with causal.
        for (bool causal : {false, true}) {
            AttentionProblem p = test::make_problem(1, 2, 1, Nq, Nkv, 19);
            p.causal = causal;
            p.block_q = 1 + gen() % 40, p.block_kv = 1 + gen() % 40;
            std::vector<std::uint8_t> mask(tile_count(Nq, p.block_q) * tile_count(Nkv, p.block_kv));
            for (auto& m : mask) m = gen() % 2;
            if (mask.size() > 1) std::fill_n(mask.begin(), tile_count(Nkv, p.block_kv), 0);  // empty row
            p.block_mask = {mask.data(), p.block_q, p.block_kv};
            check_against_reference(backend, p);
        }
    }
}
