// tests/test_cuda.cpp — the fp32 CUDA backends (cuda-standard, cuda-minimal, cuda-fa1, cuda-fa2)
// against float64 standard attention by the 2x rule (tests/helpers.hpp), with poisoned outputs, on
// shapes that are not multiples of any block size; plus the masks, GQA, NaN propagation,
// repeatability (a moving result is a race), working memory and error reporting.
//
// Built only with CUDA; its main() (cuda_main.cpp) exits with CTest's skip code 77 when no GPU is
// present. Tags: [quick] is a reduced set, [sanitize] the small set cuda/tools/gpu_check.sh runs under
// compute-sanitizer (memcheck, racecheck, synccheck).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/tiling.hpp"
#include "cuda/fa1/backend.hpp"
#include "cuda/fa2/backend.hpp"
#include "cuda/minimal/backend.hpp"
#include "cuda/host/prepared.hpp"
#include "helpers.hpp"

using namespace flashattn;
using flashattn::test::check_against_reference;

namespace {

const std::vector<std::string> kCudaBackends = {"cuda-standard", "cuda-minimal", "cuda-fa1",
                                                 "cuda-fa2"};

// A random (Tr, Tc) block mask over blocks of bq x bkv, with the first row of blocks all zero
// (rows that attend nothing) when there is more than one row of blocks.
struct RandomMask {
    std::vector<std::uint8_t> bytes;
    RandomMask(AttentionProblem& p, std::int64_t bq, std::int64_t bkv, std::mt19937& gen,
               bool set_tiles) {
        const std::int64_t Tr = tile_count(p.seq_q, bq), Tc = tile_count(p.seq_kv, bkv);
        bytes.resize(static_cast<std::size_t>(Tr * Tc));
        for (auto& m : bytes) m = gen() % 2;
        if (Tr > 1) std::fill_n(bytes.begin(), Tc, 0);
        p.block_mask = {bytes.data(), bq, bkv};
        if (set_tiles) p.block_q = bq, p.block_kv = bkv;  // tiles that straddle the mask's blocks
    }
};

}  // namespace

TEST_CASE("cuda backends match float64 attention on the odd-shape grid", "[grid]") {
    const std::string name = GENERATE(from_range(kCudaBackends));
    const Backend& backend = find_backend(name);
    const std::vector<std::pair<std::int64_t, std::int64_t>> seqs = {
        {1, 1}, {1, 203}, {7, 113}, {113, 7}, {113, 113}, {203, 1023}, {1023, 203}};
    for (auto [Nq, Nkv] : seqs)
        for (std::int64_t d : {1, 3, 59, 64, 111, 128, 256}) {
            const bool big = Nq * Nkv * d > 20'000'000;  // keep the CPU reference quick
            const std::int64_t BH = big ? 1 : 3;
            check_against_reference(backend, test::make_problem(big ? 1 : 2, BH, BH, Nq, Nkv, d));
        }
}

TEST_CASE("cuda backends: many query and key tiles, causal both ways", "[quick]") {
    const std::string name = GENERATE(from_range(kCudaBackends));
    const Backend& backend = find_backend(name);
    for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1000, 1000}, {300, 1100}, {1100, 300}, {1, 1100}})
        for (std::int64_t d : {64, 128})
            for (bool causal : {false, true})
                check_against_reference(backend, test::make_problem(1, 2, 2, Nq, Nkv, d, causal));
}

TEST_CASE("cuda backends: scale, bottom-right causal, GQA/MQA and block masks", "[quick]") {
    const std::string name = GENERATE(from_range(kCudaBackends));
    const Backend& backend = find_backend(name);
    std::mt19937 gen(Catch::rngSeed() + 11);
    for (auto [Nq, Nkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 113}, {113, 1}, {7, 203}, {203, 7}, {113, 113}, {203, 113}}) {
        for (bool causal : {false, true})
            for (std::int64_t Hkv : {6, 3, 2, 1}) {  // MHA, GQA ratios 2 and 3, MQA
                AttentionProblem p = test::make_problem(2, 6, Hkv, Nq, Nkv, 37, causal);
                p.scale = 0.3f;
                check_against_reference(backend, p);
            }
        // Random block masks with small blocks (tiles straddle mask blocks), alone and causal.
        // cuda-fa1 also takes the mask's blocks as its tiles (the others choose their own).
        for (bool causal : {false, true}) {
            AttentionProblem p = test::make_problem(1, 2, 1, Nq, Nkv, 19, causal);
            RandomMask mask(p, 1 + gen() % 40, 1 + gen() % 40, gen,
                            backend.tile_sizes == TileSizes::caller);
            check_against_reference(backend, p);
        }
    }
    // Mask blocks as large as the flash kernels' tiles, so whole tiles are skipped.
    for (bool causal : {false, true}) {
        AttentionProblem p = test::make_problem(2, 2, 1, 700, 900, 64, causal);
        RandomMask mask(p, 128, 64, gen, backend.tile_sizes == TileSizes::caller);
        check_against_reference(backend, p);
    }
}

TEST_CASE("cuda-minimal: ragged tails, every d up to 256, causal, GQA, any scale", "[quick]") {
    // One thread per query row, Br = Bc = 32 (cuda/minimal/backend.cu): N = 1, 7, 33, 113 leave short last
    // tiles on both axes (33 = one full tile and one row), and rows past seq_q sit idle in the
    // last thread block. d = 256 takes 132 KiB of shared memory; a device without it must refuse
    // with std::invalid_argument naming the size, never launch.
    const Backend& minimal = find_backend("cuda-minimal");
    CHECK(cuda::cuda_minimal_smem_bytes(256) ==
          (2 * 32 * 257 + 2 * 32 * 256 + 32 * 33) * sizeof(float));
    CHECK(cuda::cuda_minimal_smem_bytes(64) ==
          (2 * 32 * 65 + 2 * 32 * 64 + 32 * 33) * sizeof(float));
    const std::int64_t Ns[] = {1, 7, 33, 113};
    int variant = 0;
    for (std::int64_t d : {1, 3, 59, 111, 256}) {
        if (cuda::cuda_minimal_smem_bytes(d) > cuda::device_limits().smem_per_block_optin) {
            const AttentionProblem p = test::make_problem(1, 1, 1, 7, 7, d);
            const ProblemData in = random_problem_data(p, test::next_seed());
            INFO("d = " << d);
            CHECK_THROWS_WITH(minimal.prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32),
                              Catch::Contains("shared memory"));
            continue;
        }
        for (std::int64_t Nq : Ns)
            for (std::int64_t Nkv : Ns)
                for (bool causal : {false, true}) {
                    // MHA, GQA (ratio 2) and MQA in turn; the default scale and a negative one.
                    const std::int64_t Hkv = std::int64_t{4} >> (variant % 3);
                    AttentionProblem p = test::make_problem(2, 4, Hkv, Nq, Nkv, d, causal);
                    if (variant++ % 2) p.scale = -0.7f;
                    check_against_reference(minimal, p);
                }
    }
}

TEST_CASE("cuda-fa1: block sizes from the device's M, from a given M, or given directly") {
    const Backend& fa1 = find_backend("cuda-fa1");
    for (std::int64_t M : {4 * 59, 1000, 4096, 16384, 40000}) {
        AttentionProblem p = test::make_problem(1, 2, 2, 203, 313, 59);
        p.sram_floats = M;
        check_against_reference(fa1, p);
    }
    for (auto [Br, Bc] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 1}, {1, 7}, {5, 1}, {3, 5}, {16, 64}, {64, 16}, {100, 250}, {2000, 2000}}) {
        AttentionProblem p = test::make_problem(2, 2, 1, 113, 203, 59, true);
        p.block_q = Br, p.block_kv = Bc;
        // Tiles that do not fit this device's shared memory (100 x 203 at d = 59 needs ~253 KiB
        // with the tensor-core layout's padding) are refused with a clear error, not run.
        bool fits = true;
        try {
            cuda::fa1_plan(p, cuda::device_limits().smem_per_block_optin,
                           cuda::device_limits().sm_count);
        } catch (const std::invalid_argument& e) {
            fits = false;
            INFO("Br = " << Br << ", Bc = " << Bc);
            CHECK_THAT(e.what(), Catch::Contains("shared memory"));
        }
        if (fits) check_against_reference(fa1, p);
    }
    for (std::int64_t d : {1, 2, 64, 128, 200, 256}) {  // device M, lowered until S_ij fits
        const AttentionProblem p = test::make_problem(1, 2, 2, 301, 517, d, d % 2 == 0);
        const cuda::Fa1Plan plan = cuda::fa1_plan(p, cuda::device_limits().smem_per_block_optin,
                                            cuda::device_limits().sm_count);
        INFO("d = " << d << ": M = " << plan.M << ", Br = " << plan.blocks.Br
                    << ", Bc = " << plan.blocks.Bc);
        CHECK(plan.smem_bytes <= cuda::device_limits().smem_per_block_optin);
        check_against_reference(fa1, p);
    }
}

TEST_CASE("cuda-fa1: the FFMA kernel (v3) and the tensor-core kernel (v5) both match", "[quick]") {
    // tf32 runs v5 where it applies (16 <= d <= 128, Bc within its registers) and v3 elsewhere;
    // ffma runs v3 everywhere (the default, auto, is tf32). Bc is varied through M (line 1)
    // across v5's range: a single key, ragged groups of 32 keys, and the largest Bc per D (at
    // d > 64, the device's M: a larger one does not fit v3's layout, which line 1 is sized by).
    const test::ScopedEnv variant("FLASHATTN_VARIANT");
    const Backend& fa1 = find_backend("cuda-fa1");
    std::mt19937 gen(Catch::rngSeed() + 29);
    for (const char* kernel : {"tf32", "ffma"}) {
        variant.set(std::string("cuda-fa1=") + kernel);
        for (std::int64_t d : {16, 37, 64, 65, 100, 128})
            for (std::int64_t M : {4 * d, 4 * d * 33, 4 * d * 100, d <= 64 ? 4 * d * 256 : 0})
                for (bool causal : {false, true}) {
                    AttentionProblem p = test::make_problem(1, 2, 1, 150, 301, d, causal);
                    p.sram_floats = M;
                    INFO(kernel << " d = " << d << " M = " << M);
                    check_against_reference(fa1, p);
                }
        AttentionProblem p = test::make_problem(1, 2, 2, 300, 250, 64, true);
        RandomMask mask(p, 1 + gen() % 90, 1 + gen() % 90, gen, true);
        check_against_reference(fa1, p);
    }
    variant.set("cuda-fa1=wrong");  // a typo is an error, not a silent default
    const AttentionProblem p = test::make_problem(1, 1, 1, 8, 8, 64);
    const ProblemData in = random_problem_data(p, 1);
    CHECK_THROWS_WITH(fa1.prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32),
                      Catch::Contains("FLASHATTN_VARIANT"));
}

TEST_CASE("cuda-fa2: every compiled kernel configuration matches float64 attention", "[quick]") {
    // FLASHATTN_VARIANT=cuda-fa2=<name> picks a configuration other than the default (the tuning knob); each
    // one must be as correct as the default, on its own range of d.
    const test::ScopedEnv variant("FLASHATTN_VARIANT");
    const Backend& fa2 = find_backend("cuda-fa2");
    std::mt19937 gen(Catch::rngSeed() + 23);
    for (const cuda::Fa2VariantInfo& v : cuda::fa2_variants()) {
        variant.set("cuda-fa2=" + v.name);
        INFO("variant " << v.name);
        for (std::int64_t d : {v.max_dim / 2 + 1, v.max_dim - 5, v.max_dim})
            for (bool causal : {false, true})
                check_against_reference(fa2, test::make_problem(2, 2, 1, 203, 333, d, causal));
        AttentionProblem p = test::make_problem(1, 2, 2, 300, 250, v.max_dim - 1, true);
        RandomMask mask(p, 1 + gen() % 90, 1 + gen() % 90, gen, false);
        check_against_reference(fa2, p);
    }
}

TEST_CASE("cuda backends: large finite logits stay finite and accurate", "[quick]") {
    // Scores up to ~1e4 that every backend computes exactly: integer q, k in [-3, 3] and a
    // power-of-two scale. With random real inputs the error at such logits is the rounding of
    // s = q.k (an ulp of 1e4 is 1e-3), which depends on the order of the dot product and would
    // make the 2x rule a coin toss between two valid float32 summation orders.
    const std::string name = GENERATE(from_range(kCudaBackends));
    for (bool causal : {false, true}) {
        AttentionProblem p = test::make_problem(1, 2, 2, 150, 250, 64, causal);
        p.scale = 64.0f;
        const std::uint64_t seed = test::next_seed();
        INFO(name << (causal ? " causal" : "") << " seed=" << seed);
        ProblemData in = random_problem_data(p, seed);
        for (std::vector<float>* m : {&in.Q, &in.K})
            for (float& x : *m) x = std::round(std::clamp(1.5f * x, -3.0f, 3.0f));
        check_against_reference(find_backend(name), p, in);
    }
}

TEST_CASE("cuda backends: rows with no visible key give O = 0 and LSE = -inf", "[quick]") {
    const std::string name = GENERATE(from_range(kCudaBackends));
    // Bottom-right causal with N_q > N_kv: rows i < N_q - N_kv see no key.
    const AttentionProblem p = test::make_problem(1, 2, 2, 300, 100, 64, true);
    const ProblemData in = random_problem_data(p, test::next_seed());
    const test::Outputs out = test::run_poisoned(find_backend(name), p, in);
    for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 200; ++i) {
            const std::int64_t row = h * 300 + i;
            INFO(name << " head " << h << " row " << i);
            REQUIRE(out.lse[row] == -std::numeric_limits<float>::infinity());
            for (std::int64_t k = 0; k < 64; ++k) REQUIRE(out.O[row * 64 + k] == 0.0f);
        }
}

TEST_CASE("cuda backends: a NaN reaches exactly the rows that attend it", "[quick]") {
    const std::string name = GENERATE(from_range(kCudaBackends));
    const Backend& backend = find_backend(name);
    const std::int64_t N = 150, d = 64, j = 100, col = 7;  // causal: rows i >= j attend key j
    const AttentionProblem p = test::make_problem(1, 1, 1, N, N, d, true);
    // cuda-standard's P V GEMM computes 0 * V for masked keys (documented in standard.cu), so a
    // NaN in V is checked on the flash kernels only.
    for (char where : std::string(name == "cuda-standard" ? "QK" : "QKV")) {
        ProblemData in = random_problem_data(p, test::next_seed());
        std::vector<float>& target = where == 'Q' ? in.Q : where == 'K' ? in.K : in.V;
        target[j * d + col] = std::numeric_limits<float>::quiet_NaN();
        const test::Outputs out = test::run_poisoned(backend, p, in);
        for (std::int64_t i = 0; i < N; ++i) {
            // Q row j: only output row j. K row j: all of every row that attends key j.
            // V row j, column col: column col of every row that attends key j.
            int wrong = 0;
            for (std::int64_t k = 0; k < d; ++k) {
                const bool expect = where == 'Q' ? i == j : i >= j && (where == 'K' || k == col);
                wrong += std::isnan(out.O[i * d + k]) != expect;
            }
            INFO(name << ": NaN in " << where << " row " << j << ", output row " << i);
            CHECK(wrong == 0);
        }
    }
}

TEST_CASE("cuda backends: repeated runs give bitwise identical results", "[quick]") {
    const std::string name = GENERATE(from_range(kCudaBackends));
    const Backend& backend = find_backend(name);
    for (std::int64_t d : {64, 111})
        for (bool causal : {false, true}) {
            const AttentionProblem p = test::make_problem(2, 4, 2, 777, 1031, d, causal);
            const ProblemData in = random_problem_data(p, test::next_seed());
            std::vector<float> first(p.q_elements()), again(p.q_elements());
            std::vector<float> first_lse(p.lse_elements()), again_lse(p.lse_elements());
            auto prepared = backend.prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32);
            prepared->execute();
            prepared->fetch(first.data(), first_lse.data());
            for (int run = 0; run < 3; ++run) {
                // A fresh preparation every other run: new allocations, same answer.
                if (run % 2)
                    prepared =
                        backend.prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32);
                prepared->execute();
                prepared->fetch(again.data(), again_lse.data());
                INFO(name << " d=" << d << (causal ? " causal" : "") << " run " << run);
                CHECK(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) == 0);
                CHECK(std::memcmp(first_lse.data(), again_lse.data(),
                                  first_lse.size() * sizeof(float)) == 0);
            }
        }
}

TEST_CASE(
    "cuda backends: working memory is S/P for standard, l and m for fa1, none for minimal, fa2") {
    const AttentionProblem p = test::make_problem(2, 4, 2, 333, 517, 64);
    const ProblemData in = random_problem_data(p, test::next_seed());
    const auto extra = [&](const std::string& name) {
        auto prepared =
            find_backend(name).prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32);
        prepared->execute();
        return prepared->extra_bytes();
    };
    CHECK(extra("cuda-standard") == std::size_t(2 * 4 * 333 * 517) * sizeof(float));
    CHECK(extra("cuda-fa1") == std::size_t(2 * 2 * 4 * 333) * sizeof(float));
    CHECK(extra("cuda-minimal") == 0);
    CHECK(extra("cuda-fa2") == 0);
}

TEST_CASE("cuda backends: bad requests are std::invalid_argument naming the field") {
    const AttentionProblem p = test::make_problem(1, 2, 2, 64, 64, 64);
    const ProblemData in = random_problem_data(p, test::next_seed());
    for (const std::string& name : kCudaBackends) {
        const Backend& backend = find_backend(name);
        CHECK_FALSE(backend.supports(DType::f16));
        CHECK_THROWS_WITH(backend.prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f16),
                          Catch::Contains("dtype = f16"));
        AttentionProblem bad = p;
        bad.heads_kv = 3;
        CHECK_THROWS_WITH(backend.prepare(bad, in.Q.data(), in.K.data(), in.V.data(), DType::f32),
                          Catch::Contains("heads_kv = 3"));
    }
    // cuda-fa1 tiles that cannot fit in shared memory.
    AttentionProblem big = test::make_problem(1, 1, 1, 3000, 3000, 256);
    const ProblemData big_in = random_problem_data(big, test::next_seed());
    big.block_q = 3000, big.block_kv = 3000;
    CHECK_THROWS_AS(find_backend("cuda-fa1").prepare(big, big_in.Q.data(), big_in.K.data(),
                                                     big_in.V.data(), DType::f32),
                    std::invalid_argument);
    // More query rows per block than cuda-fa1 has threads to stage their m_i, l_i (the tile
    // itself, 300 x 8 at d = 16, fits in shared memory).
    AttentionProblem tall = test::make_problem(1, 1, 1, 1000, 100, 16);
    const ProblemData tall_in = random_problem_data(tall, test::next_seed());
    tall.block_q = 300, tall.block_kv = 8;
    CHECK_THROWS_WITH(find_backend("cuda-fa1").prepare(tall, tall_in.Q.data(), tall_in.K.data(),
                                                       tall_in.V.data(), DType::f32),
                      Catch::Contains("block_q = 300"));
    big.block_q = big.block_kv = 0;
    big.sram_floats = 100'000'000;
    CHECK_THROWS_WITH(find_backend("cuda-fa1").prepare(big, big_in.Q.data(), big_in.K.data(),
                                                       big_in.V.data(), DType::f32),
                      Catch::Contains("sram_floats = 100000000"));
}

TEST_CASE("cuda backends: small shapes for compute-sanitizer", "[sanitize]") {
    const std::string name = GENERATE(from_range(kCudaBackends));
    const Backend& backend = find_backend(name);
    std::mt19937 gen(Catch::rngSeed() + 17);
    for (std::int64_t d : {59, 64, 130})  // 16-byte and 4-byte copies; two kernel configurations
        for (bool causal : {false, true}) {
            AttentionProblem p = test::make_problem(1, 2, 1, 131, 203, d, causal);  // GQA, ragged tails
            if (name == "cuda-fa1") p.block_q = 48, p.block_kv = 80;  // several i and j steps
            check_against_reference(backend, p);
        }
    AttentionProblem p = test::make_problem(1, 1, 1, 150, 200, 64);
    RandomMask mask(p, 30, 70, gen, name == "cuda-fa1");
    check_against_reference(backend, p);
}
