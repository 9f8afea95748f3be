// tests/test_split_kv.cpp — split-KV decoding (docs/decoding.md) on every backend of the registry:
// few query rows against many keys, with AttentionProblem::kv_splits forcing S chunks (clamped to
// the key tiles) or leaving S to the backend. A backend that splits merges the chunks' partial
// results (merge_partial_row); one that does not ignores kv_splits. Either way the output must
// follow the 2x rule against float64 attention, with poisoned outputs, under causal (bottom-right,
// N_q < N_kv), GQA and block masks that hide whole chunks from some rows. Every backend: the same
// bits on every run at a fixed S; GQA groups packed into one head's rows (common/gqa_packing.hpp)
// compute the same attention. For omp: the same bits for any thread count at a fixed S, the
// automatic decision itself, and the partials counted in its working memory.
#include <cmath>
#include <cstring>
#include <random>

#include "backends_under_test.hpp"
#include "common/gqa_packing.hpp"
#include "common/tiling.hpp"
#include "cpu/omp.hpp"
#include "omp_threads.hpp"

using namespace flashattn;
using test::check_against_reference;
using test::make_problem;
using test::ThreadCount;

namespace {

// S = 0 (the backend chooses), 1 (no split), S that divide no tile count here, and S beyond the
// number of key tiles (clamped), up to the largest allowed. The GPU combine (cuda/stages/combine.cuh)
// reads parts in rounds of 16 and 32: 7 fills part of one, 20 part of the second half of the first
// round of 32, 50 part of the second half of the next, and 64 (or the key tiles it is clamped to,
// 33 or 65 here) a whole round and one part of the next.
const std::vector<std::int64_t> kSplits = {0, 1, 2, 3, 7, 20, 50, 64, 128, 1024};
const std::vector<std::int64_t> kDecodeRows = {1, 3, 4};
const std::vector<std::int64_t> kDecodeKeys = {1, 7, 203, 1023, 4099};

// Runs p on every backend that takes it, in the backend's test precision, once per S.
void on_every_backend_for_each_split(AttentionProblem p) {
    for (const Backend& b : available_backends()) {
        if (!test::backend_accepts(b, p)) continue;
        for (std::int64_t S : kSplits) {
            p.kv_splits = S;
            INFO("kv_splits = " << S);
            check_against_reference(b, p, test::test_dtype(b));
        }
    }
}

// S as the prepared backend reports it after one execute().
std::int64_t splits_used(const Backend& b, const AttentionProblem& p, DType dtype = DType::f32) {
    const ProblemData in = random_problem_data(p, test::next_seed());
    auto prepared = b.prepare(p, in.Q.data(), in.K.data(), in.V.data(), dtype);
    prepared->execute();
    return prepared->kv_splits();
}

// A (Tr, Tc) block mask over blocks of one query row and `block_kv` keys in which row 0 sees only
// the first block of keys, row 1 only the last, row 2 nothing at all, and the other rows a random
// eighth of the blocks: for any S > 1, row 0 and row 1 have chunks that are entirely masked, and
// the other rows most likely too.
std::vector<std::uint8_t> chunk_hiding_mask(const AttentionProblem& p, std::int64_t block_kv,
                                            std::mt19937& gen) {
    const std::int64_t Tc = tile_count(p.seq_kv, block_kv);
    std::vector<std::uint8_t> mask(p.seq_q * Tc, 0);
    mask[0] = 1;
    if (p.seq_q > 1) mask[Tc + Tc - 1] = 1;
    for (std::int64_t i = 3; i < p.seq_q; ++i)
        for (std::int64_t j = 0; j < Tc; ++j) mask[i * Tc + j] = gen() % 8 == 0;
    return mask;
}

bool same_bits(const test::Outputs& a, const test::Outputs& b) {
    return std::memcmp(a.O.data(), b.O.data(), a.O.size() * sizeof(float)) == 0 &&
           std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("split-KV: every backend matches float64 attention at decode shapes, for every S") {
    for (std::int64_t Nq : kDecodeRows)
        for (std::int64_t Nkv : kDecodeKeys)
            for (std::int64_t d : {3, 64, 111})
                for (std::int64_t H : {2, 4})  // MHA (H = H_kv = 2) and GQA (H = 4, H_kv = 2)
                    for (bool causal : {false, true}) {
                        AttentionProblem p = make_problem(1, H, 2, Nq, Nkv, d, causal);
                        on_every_backend_for_each_split(p);
                    }
}

TEST_CASE("split-KV: small tiles give many chunks, S dividing no tile count, and S beyond it") {
    // The forms that take tile sizes (TileSizes::caller): Bc = 7 or 16 keys cut N_kv = 4099 into
    // 586 or 257 tiles, so S = 7, 64 and 128 are chunks of several tiles that do not divide them
    // evenly, and S = 1024 is clamped; N_kv = 203 has 29 or 13 tiles, fewer than most S.
    for (const Backend& b : available_backends()) {
        if (b.tile_sizes != TileSizes::caller) continue;
        for (std::int64_t Bc : {7, 16})
            for (std::int64_t Nkv : {203, 4099})
                for (std::int64_t Nq : {1, 3})
                    for (bool causal : {false, true}) {
                        AttentionProblem p = make_problem(1, 4, 2, Nq, Nkv, 37, causal);
                        p.block_q = 4, p.block_kv = Bc;
                        if (!test::backend_accepts(b, p)) continue;
                        for (std::int64_t S : kSplits) {
                            p.kv_splits = S;
                            INFO("kv_splits = " << S);
                            check_against_reference(b, p, test::test_dtype(b));
                        }
                    }
    }
}

TEST_CASE("GQA packing: the packed problem is the same attention, and is used only where it is") {
    // gqa_packed (common/gqa_packing.hpp) reads a GQA group's query heads as one head of G N_q
    // rows. Every backend runs the packed problem on the original memory; its outputs are checked
    // against float64 attention of the ORIGINAL problem, so a packing that changed the meaning of
    // a row (its keys, its mask) fails here on every backend, the CPU forms included.
    std::mt19937 gen(Catch::rngSeed() + 29);
    const std::int64_t Br = 64;
    for (std::int64_t Nq : {1, 3})
        for (std::int64_t Nkv : {1, 203, 4099})
            for (bool causal : {false, true})
                for (bool masked : {false, true}) {
                    AttentionProblem p = make_problem(2, 8, 2, Nq, Nkv, 64, causal);
                    std::vector<std::uint8_t> mask;
                    if (masked) {  // one mask row (block_q >= N_q), a random half of 13 key blocks
                        const std::int64_t block_kv = 16, Tc = tile_count(Nkv, block_kv);
                        for (std::int64_t j = 0; j < Tc; ++j) mask.push_back(gen() % 2);
                        mask[0] = 1;  // every row sees a key
                        p.block_mask = {mask.data(), Nq, block_kv};
                    }
                    const AttentionProblem packed = gqa_packed(p, Br);
                    INFO(test::describe(p));
                    // Packed exactly where the masks allow it (causal only for one row).
                    const bool expect_packed = !causal || Nq == 1;
                    REQUIRE((packed.heads == p.heads_kv) == expect_packed);
                    if (!expect_packed) continue;
                    CHECK(packed.seq_q == 4 * Nq);
                    CHECK(packed.heads_kv == p.heads_kv);
                    CHECK(packed.q_elements() == p.q_elements());
                    CHECK(!packed.causal);
                    const ProblemData in = random_problem_data(p, test::next_seed());
                    const Reference ref =
                        reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
                    for (const Backend& b : available_backends()) {
                        if (!test::backend_accepts(b, packed)) continue;
                        INFO(b.name);
                        const DType dtype = test::test_dtype(b);
                        const RuleBounds bound = rule_bounds(p, in, ref, dtype);
                        const test::Outputs out = test::run_poisoned(b, packed, in, dtype);
                        CHECK(max_abs_error(out.O.data(), ref.O.data(), p.q_elements()) <=
                              bound.O);
                        CHECK(max_abs_error(out.lse.data(), ref.lse.data(),
                                                  p.lse_elements()) <= bound.lse);
                    }
                }
    // Not packed: no GQA; a mask with a row per query block; prefill, whose query tiles are full
    // already (packing would not lower their number).
    CHECK(gqa_packed(make_problem(1, 4, 4, 1, 4099, 64), Br).heads == 4);
    AttentionProblem rows_masked = make_problem(1, 4, 2, 3, 4099, 64);
    std::vector<std::uint8_t> mask(3 * 257, 1);
    rows_masked.block_mask = {mask.data(), 1, 16};
    CHECK(gqa_packed(rows_masked, Br).heads == 4);
    CHECK(gqa_packed(make_problem(1, 4, 2, 128, 4099, 64), Br).heads == 4);
    CHECK(gqa_packed(make_problem(1, 8, 2, 100, 4099, 64), Br).heads == 2);  // 4 x 2 tiles -> 7
}

TEST_CASE("split-KV: chunks a block mask hides from a row contribute nothing") {
    // Rows that see only the first or only the last block of keys have fully masked chunks (LSE
    // -inf, O = 0 in their partials); a row that sees nothing stays O = 0, LSE = -inf after the
    // merge. With the backend's own tiles and, where it takes them, tiles of the mask's blocks.
    std::mt19937 gen(Catch::rngSeed() + 17);
    for (const Backend& b : available_backends())
        for (std::int64_t Nq : {3, 4})
            for (std::int64_t Nkv : {1023, 4099})
                for (bool causal : {false, true})
                    for (bool mask_tiles : {false, true}) {
                        if (mask_tiles && b.tile_sizes != TileSizes::caller) continue;
                        const std::int64_t block_kv = 64;
                        AttentionProblem p = make_problem(1, 4, 2, Nq, Nkv, 64, causal);
                        const std::vector<std::uint8_t> mask = chunk_hiding_mask(p, block_kv, gen);
                        p.block_mask = {mask.data(), 1, block_kv};
                        if (mask_tiles) p.block_q = 1, p.block_kv = block_kv;
                        if (!test::backend_accepts(b, p)) continue;
                        for (std::int64_t S : kSplits) {
                            p.kv_splits = S;
                            INFO("kv_splits = " << S);
                            const ProblemData in = random_problem_data(p, test::next_seed());
                            const test::Outputs out =
                                check_against_reference(b, p, in, test::test_dtype(b));
                            for (std::int64_t bh = 0; bh < p.heads; ++bh) {
                                const std::int64_t row = bh * Nq + 2;  // the row that sees nothing
                                CHECK(out.lse[row] == -INFINITY);
                                for (std::int64_t k = 0; k < p.dim; ++k)
                                    CHECK(out.O[row * p.dim + k] == 0.0f);
                            }
                        }
                    }
}

TEST_CASE("split-KV omp: the same bits on every run and for 1 to 4 threads at a fixed S") {
    std::vector<AttentionProblem> problems = {make_problem(1, 4, 2, 1, 4099, 64),
                                              make_problem(2, 2, 2, 3, 1023, 111, true),
                                              make_problem(1, 4, 2, 4, 4099, 3, true)};
    AttentionProblem small_tiles = make_problem(1, 4, 2, 3, 4099, 37, true);
    small_tiles.block_q = 4, small_tiles.block_kv = 16;
    problems.push_back(small_tiles);
    const Backend& omp = find_backend("omp");
    for (AttentionProblem p : problems)
        for (std::int64_t S : {1, 2, 3, 7, 64}) {
            p.kv_splits = S;
            INFO(test::describe(p) << " kv_splits = " << S);
            const ProblemData in = random_problem_data(p, test::next_seed());
            test::Outputs one;
            {
                ThreadCount scope(1);
                one = test::check_identical_runs(omp, p, in, DType::f32, 2);
            }
            for (int threads : {2, 3, 4}) {
                ThreadCount scope(threads);
                INFO("threads = " << threads);
                CHECK(same_bits(one, test::check_identical_runs(omp, p, in, DType::f32, 2)));
            }
        }
}

TEST_CASE("split-KV omp: splits a lone decoding row when threads would idle, and only then") {
    const Backend& omp = find_backend("omp");
    ThreadCount scope(2);
    // One query row of one head, 4099 keys in 9 tiles of 512: one work item for two threads.
    AttentionProblem p = make_problem(1, 1, 1, 1, 4099, 64);
    CHECK(omp_plan(p).Tc == 9);
    CHECK(splits_used(omp, p) > 1);  // automatic
    CHECK(splits_used(omp, p) == omp_plan(p).splits);
    p.kv_splits = 1;
    CHECK(splits_used(omp, p) == 1);  // forced off
    p.kv_splits = 5;
    CHECK(splits_used(omp, p) == 5);  // forced
    p.kv_splits = 1024;
    CHECK(splits_used(omp, p) == 9);  // clamped to the key tiles
    // Enough work items already (8 heads: four per thread), one thread, or too few key tiles
    // (N_kv = 1023: two tiles, and a chunk keeps at least two): no split. (8 query heads over 2
    // KV heads are packed into 2 heads of 4 rows, omp_problem: two items, so those split.)
    CHECK(splits_used(omp, make_problem(1, 8, 8, 1, 4099, 64)) == 1);
    CHECK(splits_used(omp, make_problem(1, 8, 2, 1, 4099, 64)) == 2);
    CHECK(splits_used(omp, make_problem(1, 1, 1, 1, 1023, 64)) == 1);
    {
        ThreadCount one(1);
        CHECK(splits_used(omp, make_problem(1, 1, 1, 1, 4099, 64)) == 1);
    }
    // The rule itself (omp.hpp): two tasks per thread, no chunk below two tiles.
    const AttentionProblem automatic = make_problem(1, 1, 1, 1, 4099, 64);
    CHECK(omp_kv_splits(automatic, 1, 9, 2) == 4);
    CHECK(omp_kv_splits(automatic, 3, 9, 2) == 2);
    CHECK(omp_kv_splits(automatic, 4, 9, 2) == 1);
    CHECK(omp_kv_splits(automatic, 1, 9, 16) == 4);   // capped at 9 / 2 chunks
    CHECK(omp_kv_splits(automatic, 1, 3, 16) == 1);
    CHECK(omp_kv_splits(automatic, 1, 100, 16) == 32);
}

TEST_CASE("split-KV: the choice of S, and the full wave where chunks stay long") {
    // choose_kv_splits: S = 1 once the tasks fill 80% of the slots; else the smallest S within
    // 85% of the best wave efficiency, chunks of at least 4 tiles.
    CHECK(choose_kv_splits(212, 264, 1024, 4) == 1);
    CHECK(choose_kv_splits(8, 264, 1024, 4) == 29);  // 232 of 264 slots
    CHECK(choose_kv_splits(8, 132, 1024, 4) == 15);  // 120 of 132
    CHECK(choose_kv_splits(8, 264, 64, 4) == 14);    // at most 64 / 4 = 16 chunks: 112 of 264
    CHECK(choose_kv_splits(32, 264, 1024, 4) == 8);  // 256 of 264
    // The GPU's refinement (cuda::kv_splits_for: long chunks = 32 tiles, at most 32 chunks): a
    // full wave where every chunk keeps 32 tiles or more, the smallest good S elsewhere.
    const auto gpu = [](std::int64_t items, std::int64_t slots, std::int64_t tiles) {
        return choose_kv_splits_filling_wave(items, slots, tiles, 4, 32, 32);
    };
    CHECK(gpu(8, 264, 1024) == 32);  // chunks of 32 tiles, not up to 36
    CHECK(gpu(8, 264, 2048) == 32);  // capped at 32 chunks, though 33 would fit
    CHECK(gpu(8, 264, 1023) == 29);  // 1023 / 32 < 32 tiles a chunk: unchanged
    CHECK(gpu(8, 264, 512) == 29);
    CHECK(gpu(8, 132, 1024) == 16);  // one CTA per SM (cuda-fa3): 128 of 132
    CHECK(gpu(32, 264, 1024) == 8);  // the smallest good S already fills the wave
    CHECK(gpu(212, 264, 1024) == 1);
    CHECK(gpu(300, 264, 1024) == 1);
    CHECK(gpu(0, 264, 1024) == 1);
}

TEST_CASE("split-KV omp: working memory counts the partial results") {
    const Backend& omp = find_backend("omp");
    // One thread: each thread's tile buffers live while it works, so with two the peak holds one
    // or two of them depending on whether the threads overlap in time, and a loaded machine
    // (where one thread can finish before the other starts) gave the split run one buffer less
    // than the unsplit run. With one thread both peaks hold exactly one.
    ThreadCount scope(1);
    AttentionProblem p = make_problem(2, 4, 2, 3, 4099, 64);
    p.block_q = 4, p.block_kv = 16;  // 257 key tiles: S = 128 is not clamped
    const ProblemData in = random_problem_data(p, test::next_seed());
    const auto extra_bytes = [&](std::int64_t S) {
        p.kv_splits = S;
        auto prepared = omp.prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32);
        prepared->execute();
        REQUIRE(prepared->kv_splits() == S);
        return prepared->extra_bytes();
    };
    const std::size_t unsplit = extra_bytes(1), split = extra_bytes(128);
    // O_s and LSE_s: B * H * S * N_q rows of d + 1 floats.
    CHECK(split >= unsplit + std::size_t{2 * 4 * 128 * 3} * (64 + 1) * sizeof(float));
}

TEST_CASE("split-KV: every backend gives the same bits on every run at a fixed S") {
    // The partials of a split are written by separate CTAs (threads) and merged in a fixed order
    // (merge_partial_row), so for a fixed S nothing may depend on timing: repeated runs of one
    // prepared problem, and a second preparation (other buffers), give the same bits. GQA packed
    // (N_q = 1), a causal N_q < N_kv, and MHA with a head dim the tiles pad.
    const std::vector<AttentionProblem> problems = {make_problem(1, 8, 2, 1, 4099, 64),
                                                    make_problem(2, 4, 2, 4, 4099, 64, true),
                                                    make_problem(1, 4, 4, 3, 1023, 111)};
    for (const Backend& b : available_backends())
        for (AttentionProblem p : problems) {
            if (!test::backend_accepts(b, p)) continue;
            for (std::int64_t S : {2, 7, 64}) {
                p.kv_splits = S;
                INFO(b.name << " kv_splits = " << S);
                const ProblemData in = random_problem_data(p, test::next_seed());
                const DType dtype = test::test_dtype(b);
                const test::Outputs first = test::check_identical_runs(b, p, in, dtype, 3);
                CHECK(same_bits(first, test::check_identical_runs(b, p, in, dtype, 1)));
            }
        }
}

TEST_CASE("split-KV: every backend reports the S it used, within what was asked") {
    for (const Backend& b : available_backends()) {
        AttentionProblem p = make_problem(1, 2, 2, 1, 4099, 64);
        if (!test::backend_accepts(b, p)) continue;
        INFO(b.name);
        for (std::int64_t S : {1, 3, 1024}) {
            p.kv_splits = S;
            const std::int64_t used = splits_used(b, p, test::test_dtype(b));
            INFO("kv_splits = " << S << ", used " << used);
            CHECK(used >= 1);
            CHECK(used <= S);
        }
        if (b.name == "standard" || b.name == "scalar") {  // the forms that never split
            p.kv_splits = 7;
            CHECK(splits_used(b, p) == 1);
        }
    }
}
