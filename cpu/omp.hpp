// cpu/omp.hpp — FlashAttention-2 on the CPU: cache-sized tiles, OpenMP over query tiles.
//
// The loop order of FlashAttention-2 (Dao 2023, Algorithm 1 of that paper): the loop over query
// tiles Q_i is outside and its iterations are independent, the loop over key/value tiles K_j, V_j
// is inside. One thread owns one (batch, head, Q_i) work item from start to finish: it keeps
// m_i, l_i and the unnormalized O_i for its Br rows, streams every K_j, V_j past them, and
// divides by l_i once at the end. So work items run in parallel with no shared state, and each
// result is computed by one thread in one fixed order: the output is bitwise identical for any
// thread count.
//
// The tile products S_ij = Q_i K_j^T and O_i += P_ij V_j are register-blocked loops over 6 query
// rows at a time (4 without AVX; cpu/tile_products.hpp), and each row group goes through scores,
// softmax and values before the next, while its scores are in L1. The softmax steps between the products are
// the rule of common/online_softmax.hpp, row by row (cpu/vector_softmax.hpp for the vectorized
// row forms). Working memory is a few tile buffers per thread, O(threads * (Br + Bc) * d),
// never O(N^2). docs/omp.md explains the tile sizes.
//
// Split-KV (Flash-Decoding; docs/decoding.md): when the work items above are too few to keep the
// threads busy (decoding: a handful of query rows against a long key sequence), the key tiles are
// cut into S chunks and every (work item, chunk) pair is a task of its own. A task runs the same
// loop over its chunk's tiles only and leaves a partial result, O_s normalized by its own sum and
// LSE_s, in float32 working memory; then each row's S partials are merged in the order
// s = 0 .. S-1 by merge_partial_row (common/online_softmax.hpp). For a fixed S the output is again
// bitwise identical for any thread count; the automatic S depends on the thread count.
#pragma once

#include <cstdint>

#include "common/backend.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"

namespace flashattn {

// The problem omp runs for `problem` (validated): its GQA groups packed into one head's rows where
// a head has fewer query rows than a cache tile holds (gqa_packed, common/gqa_packing.hpp), so
// that decoding packs each K/V tile once per group instead of once per query head and fills
// more rows of the register blocks. Problems with tile sizes of their own are run as they are.
AttentionProblem omp_problem(const AttentionProblem& problem);

// The tiles the omp form uses for a problem.
struct OmpPlan {
    BlockSizes blocks;               // Br query rows, Bc key/value rows per tile
    std::int64_t Tr = 0, Tc = 0;     // number of query tiles and key/value tiles
    std::int64_t row_stride = 0;     // Br rounded up to whole row groups (tile_products.hpp)
    std::int64_t key_stride = 0;     // Bc rounded up to whole key blocks (64 keys with AVX-512)
    std::int64_t value_stride = 0;   // d rounded up to whole vectors (16 floats with AVX-512)
    std::int64_t thread_floats = 0;  // floats of one thread's tile buffers
    std::int64_t splits = 1;         // S: key chunks whose partial results are merged (1 = none)
};

// Block sizes chosen for the cache hierarchy (docs/omp.md): Br = 1008, Bc = 512 for d <= 64 and
// less for larger d (65536 / d and 32768 / d), so that one thread's tiles stay within ~800 KiB;
// Br a multiple of 48, Bc of 16.
BlockSizes omp_cache_blocks(std::int64_t dim);

// The problem's own tile sizes win (block_q/block_kv, or Algorithm 1 line 1 on sram_floats, as
// for scalar); otherwise omp_cache_blocks(), with Br lowered (not below 96 rows) until there are
// two work items per OpenMP thread, and evened out over the query tiles. Validates the problem.
// The split S is omp_kv_splits()'s.
OmpPlan omp_plan(const AttentionProblem& problem);

// The number of key chunks S for `items` = batch * heads * Tr work items, Tc key tiles and
// `threads` OpenMP threads. problem.kv_splits >= 1 forces S, clamped to Tc (a chunk is at least
// one whole tile). Automatic (kv_splits = 0): S = 1 when one thread does everything anyway or when
// there are already two work items per thread; otherwise enough chunks for two tasks per thread,
// S = ceil(2 threads / items), but no chunk shorter than two key tiles (S <= Tc / 2).
std::int64_t omp_kv_splits(const AttentionProblem& problem, std::int64_t items, std::int64_t Tc,
                           std::int64_t threads);

// omp_problem(problem) run with omp_plan's tiles. O: (batch, heads, seq_q, dim); lse: (batch,
// heads, seq_q) or nullptr. Uses the OpenMP threads
// of the caller (omp_set_num_threads / OMP_NUM_THREADS). Returns the number of key chunks S it
// merged (1: no split). Throws std::invalid_argument for an invalid problem, std::runtime_error
// when working memory cannot be allocated.
std::int64_t omp_attention(const AttentionProblem& problem, const float* Q, const float* K,
                           const float* V, float* O, float* lse);

// The backward pass in FlashAttention-2's order (cpu/omp_backward.cpp): D = rowsum(dO o O) first,
// then K/V tiles outer with dK_j, dV_j accumulated on chip and dQ_i added per tile pair. dQ: shape
// of Q; dK, dV: shape of K, V (summed over a GQA group). Bitwise identical for any thread count.
// Throws std::invalid_argument for an invalid problem or a missing array.
void omp_backward(const AttentionProblem& problem, const BackwardInputs& in, float* dQ, float* dK,
                  float* dV);

}  // namespace flashattn
