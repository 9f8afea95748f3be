// cuda/fa3/backward_kernel.cuh — cuda-fa3's backward: FlashAttention-2's Algorithm 2 with its five
// products on Hopper's warpgroup MMA (wgmma), K_j and V_j resident in shared memory, Q_i and dO_i
// copied by TMA into a ring of two or three slots. Host side: cuda/fa3/backward.cu; the products:
// cuda/fa3/products.cuh; what every tensor-core backward shares (the statistics, P and dS, the dQ
// additions and turns, the final writes): cuda/stages/flash_backward.cuh. Needs sm_90a.
//
// The work is laid out as cuda-tc's backward (cuda/stages/flash_backward.cuh explains why): one
// CTA per key tile j and K/V head, looping over every query head of the GQA group and every query
// tile i that can see key tile j, with dK_j and dV_j in registers for the whole loop, and the
// transposed products (S^T, dP^T: rows = keys), so that P^T and dS^T are already the register A
// operand of dV_j += P^T dO_i and dK_j += dS^T Q_i. What wgmma changes:
//   * a warpgroup (4 warps, 128 threads) owns 64 keys, and its products are 64 x N: two
//     warpgroups make Bc = 128. (At d = 256 both warpgroups own the same 64 keys and split
//     dK_j, dV_j's columns: Fa3BackwardTile.) Whether a warpgroup skips or masks a tile is decided
//     per warpgroup (a wgmma is collective); P, dS and the masks are still per element.
//   * S^T, dP^T read K_j, V_j, Q_i and dO_i from shared memory (K-major, no ldmatrix); dV_j and dK_j
//     read dO_i and Q_i as MN-major B operands, as the forward's P V reads V_j.
//   * dQ_i = dS K_j reads both operands from shared memory as MN-major: dS^T as stored
//     (keys x queries) and K_j (keys x d). dQ_i (Br x d) is cut into 64 x 64 blocks, one per
//     warpgroup in the default tiles (d = 64 with Br = 128, d = 128 with Br = 64 under a causal
//     mask; two at d = 256), each written to shared memory and added to dQ's fp32 sum in HBM by
//     TMA's reduce-add (add_dq_block; cuda-tc adds with per-thread atomics), in a fixed order in
//     deterministic mode. d = 128's default tile without a mask takes Br = 80 query rows
//     (FlashAttention-3's): 80 is no multiple of a warpgroup's 64 rows, so there dQ_i^T = K_j^T
//     dS^T is computed instead, from dS stored transposed (Fa3BackwardTile::kDqTransposed).
//
// Algorithm 2 lines: L3 dQ's fp32 sum = 0 and L4 D_i (delta_kernel, before) | L5 one CTA per (j,
// K/V head, batch) | L6 K_j, V_j -> shared memory (TMA, once) | L7 dK_j = dV_j = 0 (registers) |
// L8 the step loop (query head, query tile) | L9 Q_i, dO_i (TMA, ring of kSlots), L_i, D_i
// (cp.async) | L10 S^T = K_j Q_i^T | L11, L14 probabilities_and_score_gradients | L12 dV_j += P^T
// dO_i | L13 dP^T = V_j dO_i^T | L15 dQ_i += scale dS K_j (add_dq_block) | L16 dK_j += dS^T Q_i |
// L18 store_key_gradient_staged (or write_key_gradients, from registers).
//
// Two forms of the CTA. In the plain one every thread computes (thread 0 also issues the copies),
// and the ring is refilled at each step's start, behind a barrier of the whole CTA. In the
// -producer tiles (FlashAttention-3's warp specialization, Section 3.1) a producer warpgroup runs
// ahead: one warp copies each step's Q_i, dO_i (TMA) and L_i, D_i (its lanes' cp.async) into a slot
// as soon as the computing warpgroups have released it (an "empty" mbarrier per slot), gives its
// registers to them (setmaxnreg), and dS^T has two buffers, so that the computing warpgroups meet
// once per step (dS^T complete) instead of twice; in the -dq-overlap-producer tile a lane of a
// second warp issues the copy engine's dQ additions, so that a computing warpgroup's warps write
// their dQ_i block without meeting each other (add_dq_block). Neither form overlaps a step's
// products with its own or the next step's softmax. Each product is waited for where it is issued,
// except in the -dq-overlap tiles (step_dq_overlapped): there dV_j's product runs across the
// barrier for dS^T, and dK_j's while dQ_i's block is added.
// docs/cuda_fa3.md, "The backward on wgmma", measures these forms, overlaps that did not pay, and
// says what comes next.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/fa3/pipeline.cuh"
#include "cuda/fa3/products.cuh"
#include "cuda/ptx/dependent_launch.cuh"
#include "cuda/ptx/hopper.cuh"
#include "cuda/ptx/mma_sync.cuh"
#include "cuda/stages/async_copy.cuh"
#include "cuda/stages/flash_backward.cuh"
#include "cuda/stages/mma_stages.cuh"

namespace flashattn::fa3 {

using cuda::BackwardParams;

// One CTA: two warpgroups. At D = 64 and 128 each owns 64 keys (Bc = 128) and all D columns of
// their dK_j, dV_j: 2 x D / 2 floats per thread. At D = 256 that would be 256 floats, every register
// there is; so there the tile has Bc = 64 keys, both warpgroups hold all 64, and they split the
// columns: warpgroup c keeps dK_j and dV_j for columns 128 c .. 128 c + 127 (128 floats per
// thread, as at D = 128). Both need all of P^T and dS^T as the A operand of their columns' dV_j and
// dK_j products; each computes S^T and dP^T for half of the queries (kQuerySplit) and writes its
// half of P^T and dS^T to shared memory, FlashAttention-3's way. Query tiles of Br = 64 or 128 rows
// (1 or 2 panels of dS^T), head dim D = 64, 128 or 256 (1, 2 or 4 panels).
template <class T_, int D_, int Br_, int kSlots_ = 2, bool kOverlap_ = false,
          bool kProducer_ = false, bool kRaggedKeys_ = false>
struct Fa3BackwardTile {
    using T = T_;
    static constexpr int D = D_;
    static constexpr int Br = Br_;
    // The ring of Q_i, dO_i, L_i, D_i: step t + kSlots - 1 is asked for as step t starts.
    static constexpr int kSlots = kSlots_;
    // dQ_i's product overlapped (-dq-overlap tiles, FlashAttention-3's order within a step): dV_j's
    // product runs across the barrier for dS^T, dQ_i's is issued behind it and dK_j's behind that,
    // so that dQ_i's block goes to shared memory and the copy engine while dK_j's product runs.
    // Otherwise dV_j's and dK_j's products are waited for before the barrier and dQ_i's after it.
    static constexpr bool kOverlapDq = kOverlap_;
    static constexpr int kWarpgroups = 2;  // that compute
    static constexpr int kComputeThreads = 128 * kWarpgroups;
    // A producer warpgroup before them (-producer tiles; the kernel's header says what it does):
    // warpgroup 0 of the CTA, 24 registers per thread, the computing threads 240 each (setmaxnreg:
    // 128 x 24 + 256 x 240 = 64,512 of the SM's 65,536). Its kernels exist without a block mask and
    // outside deterministic mode; those modes run a tile without it (its variant names which:
    // cuda/fa3/backward.cu).
    static constexpr bool kProducer = kProducer_;
    static constexpr int kThreads = kComputeThreads + (kProducer ? 128 : 0);
    static constexpr int kProducerRegisters = 24;
    // dQ_i's blocks handed to the copy engine by a lane of the producer's second warp, so that a
    // computing warpgroup's warps write their block without meeting (add_dq_block): in the
    // -dq-overlap-producer tile (d = 128), where it measured 2-3.4% faster without a mask (level,
    // to 1.6% slower, under a causal mask). In d = 64's producer tile (whose step waits for dQ_i's
    // product) it measured 4-7% slower (docs/cuda_fa3.md, "dQ_i's blocks handed to the producer").
    static constexpr bool kDqWarp = kProducer && kOverlapDq;
    static constexpr int kComputeRegisters = 240;
    // A slot's "full" barrier: the producer's TMA arrival (with the bytes) and, with a producer,
    // one more from each lane of its warp once that lane's copies of L_i, D_i have landed.
    static constexpr int kStepArrivals = kProducer ? 1 + 32 : 1;
    // dS^T's buffers: with a producer, two, used by turns: a warpgroup writing step t + 1's dS^T
    // must not overwrite step t's while the other warpgroup's dQ_i product still reads it, and no
    // barrier at the step's start keeps them together any more. One where that barrier does.
    static constexpr int kScoreGradientBuffers = kProducer ? 2 : 1;
    // Warpgroups that share one group of 64 keys and split D between them (above).
    static constexpr int kColumnGroups = D == 256 ? 2 : 1;
    static constexpr int Bc = 64 * kWarpgroups / kColumnGroups;
    static constexpr int Dw = D / kColumnGroups;  // a warpgroup's columns of dK_j and dV_j
    static constexpr int kPanels = D / 64;
    // A query tile of Br = 80 rows (FlashAttention-3's at d = 128): S^T and dP^T are 64 x 80
    // (wgmma's N may be 80), but dQ_i (80 x d) is no whole number of a warpgroup's 64-row products.
    // So it is computed transposed, dQ_i^T = K_j^T dS^T, 64 columns of d x 80 queries per
    // warpgroup (FlashAttention-3's dQ_swapAB), with dS stored as (queries x keys) for it
    // (store_score_gradients_transposed), and each block written back as (queries x d) for the copy
    // engine (add_dq_block). Only in the -dq-overlap-producer form, without a block mask, outside
    // deterministic mode: the launch runs the 64-row tile there (cuda/fa3/backward.cu).
    static constexpr bool kDqTransposed = Br == 80;
    // This tile masks no more than the keys past N_kv (score_gradients), and those only in the
    // kernel for an N_kv that is not a multiple of Bc (kRaggedKeys, FlashAttention-2's
    // Is_even_MN the other way round): a test in every step's softmax, or a branch between two
    // of them, took the computing threads over their registers.
    static constexpr bool kRaggedKeys = kRaggedKeys_;
    // dQ_i's blocks of kDqBlockRows x 64, (Br / 64) x (D / 64) of them (one row of D / 64 at Br =
    // 80), each summed over all Bc keys by one warpgroup, kDqBlocksPerWarpgroup of them each (with
    // a single block the second warpgroup has none: splitting the keys would add twice as much to
    // dQ, and two warpgroups adding to the same dQ_i in turn need an order).
    static constexpr int kDqBlockRows = kDqTransposed ? Br : 64;
    static constexpr int kDqBlocks = (kDqTransposed ? 1 : Br / 64) * kPanels;
    static constexpr int kDqBlocksPerWarpgroup = (kDqBlocks + kWarpgroups - 1) / kWarpgroups;
    // A dQ block in shared memory (add_dq_block): kDqBlockRows x 64 floats as two TMA boxes of 32
    // columns; its accumulator, kDqAccTiles m16n8 tiles per thread (dQ_i^T's are 64 x Br).
    static constexpr int kDqBlockFloats = kDqBlockRows * 64;
    static constexpr int kDqAccTiles = kDqTransposed ? Br / 8 : 8;
    // At D = 256 shared memory has no room for the dQ blocks (K_j, V_j and two slots of Q_i, dO_i
    // take 192 KB): they are written into the step's own slot of Q_i and dO_i (64 KB, exactly the
    // four blocks), whose tiles no product reads once dK_j's is done. The copy engine must then
    // have read them before the next step asks for new tiles into that slot.
    static constexpr bool kDqInSlot = D == 256;
    // At D = 256 each warpgroup computes S^T and dP^T for half of the queries (Brw of them) and
    // writes its half of P^T and dS^T to shared memory, from which both read all of them as the A
    // operand of their dV_j and dK_j columns: one more barrier per step and P^T through shared
    // memory, where both warpgroups computing all of S^T and dP^T was seven products' work for five
    // (docs/cuda_fa3.md, "Head dim 256").
    static constexpr bool kQuerySplit = D == 256;
    static constexpr int Brw = kQuerySplit ? Br / 2 : Br;
    static constexpr std::uint32_t kKeyTileBytes = Bc * D * sizeof(T_);    // K_j or V_j
    static constexpr std::uint32_t kStepBytes = 2 * Br * D * sizeof(T_);  // Q_i and dO_i
    static_assert(D == 64 || D == 128 || D == 256, "cuda-fa3 backward: D = 64, 128 or 256");
    static_assert(!kRaggedKeys || kDqTransposed, "kRaggedKeys: the 80-row tile's mask");
    static_assert(Br == 64 || Br == 128 || (Br == 80 && D == 128 && kOverlap_ && kProducer_),
                  "cuda-fa3 backward: Br = 64 or 128 (the N of S^T), or 80 in d = 128's "
                  "-dq-overlap-producer form");
    static_assert(kDqBlocksPerWarpgroup * kWarpgroups == kDqBlocks || kDqBlocks < kWarpgroups,
                  "dQ's blocks shared evenly between the warpgroups");
    static_assert(!kDqInSlot || (Br == 64 && kDqBlocks * kDqBlockFloats * 4 == kStepBytes),
                  "the dQ blocks fill exactly one slot of Q_i and dO_i");
    static_assert(kSlots == 2 || kSlots == 3, "cuda-fa3 backward: a ring of 2 or 3 slots");
    static_assert(!(kOverlapDq && (kQuerySplit || kDqBlocks != kWarpgroups)),
                  "cuda-fa3 backward: the overlapped dQ_i for one block per warpgroup (D = 64, 128)");
    static_assert(!(kProducer && (kQuerySplit || kDqInSlot)),
                  "cuda-fa3 backward: a producer warpgroup at D = 64 and 128");
};

// The named barriers (bar.sync ids) of the backward beside __syncthreads' 0: warpgroup wg's dQ_i
// staging block is kDqStaging + wg (add_dq_block); dS^T complete, both computing warpgroups
// (kScoreGradientsDone); the computing threads around the staged dK_j, dV_j (kComputeThreadsMeet).
enum BackwardBarrier : int { kDqStaging = 1, kScoreGradientsDone = 3, kComputeThreadsMeet = 4 };

// The computing threads meet: the whole CTA without a producer, else a named barrier of theirs
// (the producer's warps have left).
template <class Cfg>
__device__ __forceinline__ void sync_compute_threads() {
    if constexpr (Cfg::kProducer)
        hopper::named_barrier_sync(kComputeThreadsMeet, Cfg::kComputeThreads);
    else
        __syncthreads();
}

// The barriers: K_j and V_j have landed; slot s's Q_i, dO_i (and with a producer L_i, D_i) have
// landed; with a producer, every computing thread is done with slot s; with a dQ warp, computing
// warpgroup w's dQ block is written (dq_full: its 128 threads arrive) and the copy engine has read
// it (dq_empty: the producer's dQ warp arrives), add_dq_block.
struct Fa3BackwardBarriers {
    std::uint64_t kv;
    std::uint64_t step[3];
    std::uint64_t step_empty[3];
    std::uint64_t dq_full[2];
    std::uint64_t dq_empty[2];
    int key_tile;  // j (see the kernel: read where it is used)
    __device__ void init(int step_arrivals, int compute_threads) {
        hopper::mbarrier_init(&kv, 1);
        for (std::uint64_t& slot : step) hopper::mbarrier_init(&slot, step_arrivals);
        for (std::uint64_t& slot : step_empty) hopper::mbarrier_init(&slot, compute_threads);
        for (std::uint64_t& block : dq_full) hopper::mbarrier_init(&block, 128);
        for (std::uint64_t& block : dq_empty) hopper::mbarrier_init(&block, 1);
        hopper::fence_barrier_init();
    }
};

// Shared memory, from a 1024-byte boundary (the 128-byte swizzle repeats every 8 rows): K_j, V_j
// (Bc x D each), kSlots slots of Q_i and dO_i (Br x D each), dS^T (Bc x Br, one or two
// buffers), the dQ blocks (fp32,
// 64 x 64 each; none at D = 256, kDqInSlot), kSlots slots of L_i and D_i (Br floats each), the
// barriers.
template <class Cfg>
constexpr int backward_smem_bytes() {
    return int((2 * Cfg::Bc * Cfg::D + 2 * Cfg::kSlots * Cfg::Br * Cfg::D +
                Cfg::kScoreGradientBuffers * Cfg::Bc * Cfg::Br) *
               sizeof(typename Cfg::T)) +
           int((Cfg::kQuerySplit ? Cfg::Bc * Cfg::Br : 0) * sizeof(typename Cfg::T)) +  // P^T
           int((Cfg::kDqInSlot ? 0 : Cfg::kDqBlocks) * Cfg::kDqBlockFloats * sizeof(float)) +
           int(2 * Cfg::kSlots * Cfg::Br * sizeof(float)) + int(sizeof(Fa3BackwardBarriers)) +
           1024;
}

// What the kernel reads: the backward's parameters (shared with cuda-tc) and the tensor maps of
// Q, K, V and dO (cuda/fa3/tensor_map.hpp; boxes of 64 columns x Br or Bc rows).
struct Fa3BackwardParams {
    BackwardParams base;
    CUtensorMap q, k, v, dO;
    CUtensorMap dq_sum;  // base.dQ, fp32, boxes of 32 columns x 64 rows (add_dq_block)
    int tail;            // K/V heads whose key tiles end the grid longest first (scheduled_tile)
    // dK and dV written through shared memory (store_key_gradient_staged): both in the inputs'
    // 16-bit type, every row starting on a 16-byte boundary (rows_in_16_byte_chunks). Else from
    // registers.
    bool key_gradients_staged;
};

// Algorithm 2 L10, L13, L11 and L14 on a warpgroup's 64 keys and kCols queries: S^T = K_j Q_i^T
// and dP^T = V_j dO_i^T (A operands from sK_j, sV_j, B from sQ_i, sdO_i, in the tiles' panels),
// waited for, then P^T and dS^T in place, masked where the keys x queries tile is partly visible
// or ragged. key_column() gives the warp's first key (read where it is used: the kernel says why).
template <class Cfg, int kCols, bool kBlockMask, class KeyColumn>
__device__ __forceinline__ void score_gradients(float (&S)[kCols / 8][4], float (&dP)[kCols / 8][4],
                                                const typename Cfg::T* sK_j,
                                                const typename Cfg::T* sV_j,
                                                const typename Cfg::T* sQ_i,
                                                const typename Cfg::T* sdO_i, const float* sL_i,
                                                const float* sD_i, const BackwardParams& bp,
                                                TileVisibility seen, TileRange rows,
                                                TileRange cols, const KeyColumn& key_column,
                                                int lane) {
    using T = typename Cfg::T;
    issue_ab_t<T, kCols, Cfg::kPanels>(S, sK_j, Cfg::Bc * 64, sQ_i, Cfg::Br * 64);    // L10
    issue_ab_t<T, kCols, Cfg::kPanels>(dP, sV_j, Cfg::Bc * 64, sdO_i, Cfg::Br * 64);  // L13
    hopper::wgmma_wait<0>();
    hopper::wgmma_fence_registers(S);
    hopper::wgmma_fence_registers(dP);
    using cuda::ScoreMask;
    if constexpr (Cfg::kDqTransposed) {
        // Without a causal or block mask (the launch runs this tile only so), the keys past N_kv
        // are all a step hides (ScoreMask::keys_past_end), and only where N_kv is not a multiple
        // of Bc (Fa3BackwardTile::kRaggedKeys). The per-entry mask of a ragged tile beside the
        // unmasked step took ptxas over the computing threads' registers at 80 queries: they
        // spilled in every step.
        constexpr ScoreMask kMask = Cfg::kRaggedKeys ? ScoreMask::keys_past_end : ScoreMask::none;
        cuda::probabilities_and_score_gradients<kCols, kBlockMask, kMask, false, true>(
            S, dP, sL_i, sD_i, bp, rows.begin, key_column(), lane);
    } else if (seen == TileVisibility::partial || rows.size() < kCols || cols.size() < 64) {
        cuda::probabilities_and_score_gradients<kCols, kBlockMask, ScoreMask::visible, false, true>(
            S, dP, sL_i, sD_i, bp, rows.begin, key_column(), lane);
    } else {
        cuda::probabilities_and_score_gradients<kCols, kBlockMask, ScoreMask::none, false, true>(
            S, dP, sL_i, sD_i, bp, rows.begin, key_column(), lane);
    }
}

// Algorithm 2 L15's left operand: a warp's 16 keys of dS^T, already rounded to T as the A operand
// of dK_j's product (pack_a: k-step kk holds columns 16 kk .. 16 kk + 15), into shared memory as
// Br / 64 panels (Bc rows of keys x 64 queries each) in the 128-byte swizzle (16-byte chunk c of
// row r at c ^ (r % 8)). Reading the registers while that product still runs is allowed (a wgmma
// only forbids writing them), so the stores overlap it.
// kCols query columns from col0 on (a multiple of kCols, or of 64 where kCols > 64): Br, or a
// warpgroup's Brw where the warpgroups split the queries (kQuerySplit, which stores P^T the same
// way).
// The addresses: a thread's keys are key0 + lane / 4 + 8 r with key0 a multiple of 16, so
// r % 8 = lane / 4 for both, and the swizzle only flips bits 4-6 of a 1024-byte-aligned row's
// address. The thread's part of that XOR is taken once; each store adds the chunk's part (one
// XOR with a constant) and its panel and row group as the store's immediate offset.
template <class Cfg, int kCols = Cfg::Br>
__device__ __forceinline__ void store_score_gradients(typename Cfg::T* sdS,
                                                      const std::uint32_t (&adS)[kCols / 16][4],
                                                      int key0, int lane, int col0 = 0) {
    static_assert(kCols <= 64 ? 64 % kCols == 0 : kCols % 64 == 0,
                  "store_score_gradients: the chunks of col0 and of nt do not carry into each other");
    constexpr std::uint32_t kRowBytes = 128, kPanelBytes = Cfg::Bc * kRowBytes;
    const int chunk0 = col0 / 8;  // the first 8 columns' 16-byte chunk, over all panels
    const std::uint32_t thread_at = hopper::smem_address(sdS) + (chunk0 / 8) * kPanelBytes +
                                    (key0 + lane / 4) * kRowBytes +
                                    std::uint32_t(((lane / 4) ^ (chunk0 % 8)) << 4) +
                                    4 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < kCols / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
            hopper::st_shared_b32((thread_at ^ ((nt % 8) << 4)) + (nt / 8) * kPanelBytes +
                                      8 * r * kRowBytes,
                                  adS[nt / 2][2 * (nt % 2) + r]);
}

// The same dS for dQ_i^T's B operand (Cfg::kDqTransposed): stored as (queries x keys), Bc / 64
// panels of Br rows x 64 keys in the 128-byte swizzle, by one stmatrix .trans per k-step of adS.
// Its four 8 x 8 matrices m (pack_a's registers: keys key0 + 8 (m % 2) .., queries 16 kk + 8 (m /
// 2) ..) are each written as 8 query rows of 8 keys, 16 bytes: lane 8 m + c gives query row
// 16 kk + 8 (m / 2) + c's chunk, (key % 64) / 8 at chunk ^ c (c = the row % 8). A matrix's 8
// rows land in 8 different chunks: no bank conflict.
template <class Cfg>
__device__ __forceinline__ void store_score_gradients_transposed(
    typename Cfg::T* sdS, const std::uint32_t (&adS)[Cfg::Br / 16][4], int key0, int lane) {
    constexpr std::uint32_t kRowBytes = 128, kPanelBytes = Cfg::Br * kRowBytes;
    const int m = lane / 8, c = lane % 8;
    const int key = key0 + 8 * (m % 2);  // a multiple of 8
    const std::uint32_t at = hopper::smem_address(sdS) + (key / 64) * kPanelBytes +
                             (8 * (m / 2) + c) * kRowBytes +
                             std::uint32_t((((key % 64) / 8) ^ c) << 4);
#pragma unroll
    for (int kk = 0; kk < Cfg::Br / 16; ++kk)
        hopper::stmatrix_x4_trans(at + 16 * kk * kRowBytes, adS[kk]);
}

// L15's product for a warpgroup's dQ_i block (rows 64 rb .., columns 64 cb ..) over all Bc keys of
// dS^T in shared memory: dQ_i = dS K_j (issue_mn_major), or with an 80-row tile its transpose
// dQ_i^T = K_j^T dS^T (issue_at_b_t; rb = 0).
template <class Cfg>
__device__ __forceinline__ void issue_dq_block(float (&acc)[Cfg::kDqAccTiles][4],
                                               const typename Cfg::T* sdS,
                                               const typename Cfg::T* sK_j, int rb, int cb) {
    using T = typename Cfg::T;
    constexpr int Bc = Cfg::Bc;
    if constexpr (Cfg::kDqTransposed)
        issue_at_b_t<T, Cfg::Br, Bc / 16>(acc, fresh(sK_j) + cb * Bc * 64, fresh(sdS),
                                          Cfg::Br * 64);
    else
        issue_mn_major<T, Bc / 16>(acc, fresh(sdS) + rb * Bc * 64, fresh(sK_j) + cb * Bc * 64);
}

// Algorithm 2 L15's addition of one 64 x 64 block of dQ_i (Br x 64 at Br = 80, whose accumulator
// holds the block transposed: Fa3BackwardTile::kDqTransposed) (a warpgroup's fp32 accumulator acc;
// rows row0 .., columns col0 .. of head h, batch entry b) to dQ in HBM, through shared memory: the
// warpgroup writes scale acc to its block sdq, as two boxes of 32 columns in the 128-byte swizzle
// (16-byte chunk c of row r at c ^ (r % 8): the eight rows of a store land in different banks),
// and one thread hands both boxes to the copy engine's reduce-add, which adds them to dQ with no
// further work from the threads (FlashAttention-3 adds dQ from shared memory with TMA too).
// Per-thread atomics, cuda-tc's way, take 16 eight-byte atomics per thread and block, and their
// queue holds the warps back (docs/cuda_fa3.md measures both). Rows past N_q lie outside the map
// and are not added. In kDeterministic mode the thread waits until its additions are done (the
// next key tile's turn comes after them); otherwise it waits, at its next block, only until the
// copy engine has read this one. At D = 256 (Cfg::kDqInSlot) sdq lies in the step's slot of Q_i
// and dO_i, and the kernel waits for that read before the slot's next copy instead.
// With a dQ warp (Cfg::kDqWarp: a producer warpgroup, one block per warpgroup and step) the
// warpgroup's threads neither meet nor issue the copy: each waits until the copy engine has read
// the block's previous contents (bars->dq_empty[wg], the phase before this step's, parity
// step_parity ^ 1), writes, and arrives on bars->dq_full[wg]; the producer's dQ warp
// (add_dq_blocks_issued) waits for those arrivals, hands the block to the copy engine and, once it
// is read, arrives on dq_empty[wg].
template <class Cfg, bool kDeterministic>
__device__ __forceinline__ void add_dq_block(const Fa3BackwardParams& params, float* sdq,
                                             const float (&acc)[Cfg::kDqAccTiles][4],
                                             std::int64_t b,
                                             std::int64_t h, int row0, int col0, int wg,
                                             int wg_warp, int lane, Fa3BackwardBarriers* bars,
                                             std::uint32_t step_parity) {
    const bool issuer = wg_warp == 0 && lane == 0;
    if constexpr (Cfg::kDqWarp) {
        hopper::mbarrier_wait(&bars->dq_empty[wg], step_parity ^ 1);
    } else if constexpr (!Cfg::kDqInSlot) {
        // The block's previous contents have been read (the wait is for a copy issued a step ago).
        if (issuer) hopper::bulk_wait_read<0>();
        hopper::named_barrier_sync(kDqStaging + wg, 128);
    }
    const float scale = params.base.scale;
    constexpr std::uint32_t kRowBytes = 32 * sizeof(float), kBoxBytes = Cfg::kDqBlockRows * kRowBytes;
    if constexpr (Cfg::kDqTransposed) {
        // acc is dQ_i^T: entry (nt, e) is column c = 16 wg_warp + lane / 4 + 8 (e / 2) of the
        // block, query q = 8 nt + 2 (lane % 4) + e % 2, one float at a time: box wg_warp / 2 (c <
        // 32 iff wg_warp < 2), 16-byte chunk (c % 32) / 4 of row q, at chunk ^ (q % 8). The chunk,
        // 4 (wg_warp % 2) + (lane / 4) / 4 + 2 (e / 2), and q % 8 = 2 (lane % 4) + e % 2 share no
        // bit between their thread and e parts, so the swizzled chunk is the thread's part XOR e.
        // A warp's store covers 8 columns of 4 query rows: 8 different chunks, no bank conflict.
        const int g = lane / 4, t = lane % 4;
        const std::uint32_t thread_at =
            hopper::smem_address(sdq) + (wg_warp / 2) * kBoxBytes + 2 * t * kRowBytes +
            std::uint32_t(((4 * (wg_warp % 2) + g / 4) ^ (2 * t)) << 4) + 4 * (g % 4);
#pragma unroll
        for (int nt = 0; nt < Cfg::kDqAccTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                hopper::st_shared_f32(
                    (thread_at ^ (e << 4)) + nt * 8 * kRowBytes + (e % 2) * kRowBytes,
                    scale * acc[nt][e]);
    } else {
        // Row 16 wg_warp + lane / 4 + 8 r, columns 8 nt + 2 (lane % 4) (+1): box nt / 4, 16-byte
        // chunk 2 (nt % 4) + (lane % 4) / 2 of the row, at chunk ^ (lane / 4) (the row % 8 of both
        // r). The thread's part of the swizzle once, each store's as one XOR
        // (store_score_gradients).
        const std::uint32_t thread_at = hopper::smem_address(sdq) +
                                        (16 * wg_warp + lane / 4) * kRowBytes +
                                        std::uint32_t((((lane % 4) / 2) ^ (lane / 4)) << 4) +
                                        8 * (lane % 2);
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                hopper::st_shared_v2_f32((thread_at ^ ((2 * (nt % 4)) << 4)) + (nt / 4) * kBoxBytes +
                                             8 * r * kRowBytes,
                                         scale * acc[nt][2 * r], scale * acc[nt][2 * r + 1]);
    }
    hopper::fence_proxy_async();  // the stores, read next by the copy engine
    if constexpr (Cfg::kDqWarp) {
        hopper::mbarrier_arrive(&bars->dq_full[wg]);
        return;
    }
    hopper::named_barrier_sync(kDqStaging + wg, 128);
    if (!issuer) return;
    hopper::tma_reduce_add_4d(&params.dq_sum, sdq, col0, row0, int(h), int(b));
    hopper::tma_reduce_add_4d(&params.dq_sum, sdq + Cfg::kDqBlockRows * 32, col0 + 32, row0, int(h),
                              int(b));
    hopper::bulk_commit();
    if constexpr (kDeterministic) {
        hopper::bulk_wait<0>();
        hopper::fence_proxy_async_global();
    }
}

// The producer's dQ warp (Cfg::kDqWarp; lane 0 alone): for each step, in the computing
// warpgroups' order (cuda::next_step), each warpgroup's dQ_i block (warpgroup w's: rows 64 (w /
// kPanels) .., columns 64 (w % kPanels) .., as add_dq_block's callers place it) is handed to the
// copy engine's reduce-add once its 128 threads have written it, and given back to them once
// read. A block is released when the step's later one has been handed over too (bulk_wait_read<1>
// then <0>): it is next written a step later.
template <class Cfg>
__device__ __forceinline__ void add_dq_blocks_issued(const Fa3BackwardParams& params,
                                                     Fa3BackwardBarriers* bars, const float* sdQ,
                                                     TileRange cols, int Tr, int h0, int G, int b) {
    static_assert(Cfg::kDqBlocksPerWarpgroup == 1 && Cfg::kDqBlocks == Cfg::kWarpgroups &&
                      Cfg::kWarpgroups == 2,
                  "the dQ warp: one block per computing warpgroup and step, two warpgroups");
    const AttentionProblem& p = params.base.problem;
    std::uint32_t parity = 0;
    int h = h0, i = -1;
    for (cuda::next_step(p, cols, Tr, Cfg::Br, h0, G, h, i); h < h0 + G;
         cuda::next_step(p, cols, Tr, Cfg::Br, h0, G, h, i)) {
#pragma unroll
        for (int w = 0; w < Cfg::kWarpgroups; ++w) {
            const int row0 = i * Cfg::Br + Cfg::kDqBlockRows * (w / Cfg::kPanels);
            const int col0 = 64 * (w % Cfg::kPanels);
            const float* block = sdQ + w * Cfg::kDqBlockFloats;
            hopper::mbarrier_wait(&bars->dq_full[w], parity);
            hopper::tma_reduce_add_4d(&params.dq_sum, block, col0, row0, h, b);
            hopper::tma_reduce_add_4d(&params.dq_sum, block + Cfg::kDqBlockRows * 32, col0 + 32, row0,
                                      h, b);
            hopper::bulk_commit();
        }
        hopper::bulk_wait_read<1>();
        hopper::mbarrier_arrive(&bars->dq_empty[0]);
        hopper::bulk_wait_read<0>();
        hopper::mbarrier_arrive(&bars->dq_empty[1]);
        parity ^= 1;
    }
}

// Algorithm 2 L18 for one of dK_j, dV_j (acc times scale, rounded to T), through shared memory.
// Written from registers, a warp's store covers 8 rows with 16 bytes each (a thread's two adjacent
// values, four threads a row): half of a 32-byte sector per row. Staged, the warps put their
// values into `stage` (the tile's rows of D values, 16-byte chunk c of row r at c ^ (r % 8), so
// that a store's 8 rows fall in different banks), and the CTA then writes whole rows, 16 bytes per
// thread, consecutive threads along a row. Each CTA holds its SM until its last store has issued
// (one CTA per SM): docs/cuda_fa3.md, "dK_j and dV_j through shared memory", measures both ways.
// Rows past N_kv are not written. The caller has made sure no copy or product still uses `stage`.
// tid: the thread's number among the computing threads.
template <class Cfg>
__device__ __forceinline__ void store_key_gradient_staged(void* out, const ArrayLayout& at,
                                                          const float (&acc)[Cfg::Dw / 8][4],
                                                          float scale, unsigned char* stage,
                                                          int b, int g, int j, int seq_kv,
                                                          int key0, int tid, int lane, int col0) {
    using T = typename Cfg::T;
    constexpr int kRowBytes = Cfg::D * int(sizeof(T));
    constexpr int kChunks = kRowBytes / 16, kPerChunk = 16 / int(sizeof(T));
    static_assert(kChunks % 8 == 0, "the swizzle permutes groups of 8 chunks");
    const std::uint32_t base = hopper::smem_address(stage);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = key0 + lane / 4 + 8 * r;  // row % 8 = lane / 4: key0 is a multiple of 16
#pragma unroll
        for (int dt = 0; dt < Cfg::Dw / 8; ++dt) {
            const int col = col0 + 8 * dt + 2 * (lane % 4);  // and col + 1, in the same chunk
            hopper::st_shared_b32(base + row * kRowBytes + (((col / kPerChunk) ^ (lane / 4)) << 4) +
                                      (col % kPerChunk) * int(sizeof(T)),
                                  tc::pack2<T>(scale * acc[dt][2 * r], scale * acc[dt][2 * r + 1]));
        }
    }
    sync_compute_threads<Cfg>();
    const int rows = min(Cfg::Bc, seq_kv - j * Cfg::Bc);
    T* first = static_cast<T*>(out) + at.offset(b, g) + std::int64_t(j) * Cfg::Bc * at.row;
    for (int c = tid; c < rows * kChunks; c += Cfg::kComputeThreads) {
        const int row = c / kChunks, chunk = c % kChunks;
        const uint4 v = *reinterpret_cast<const uint4*>(stage + row * kRowBytes +
                                                        ((chunk ^ (row % 8)) << 4));
        *reinterpret_cast<uint4*>(first + row * at.row + chunk * kPerChunk) = v;
    }
    sync_compute_threads<Cfg>();  // the stage is free again
}

// One step of a -dq-overlap tile (Cfg::kOverlapDq; without a block mask, not in deterministic
// mode: those kernels keep the step below, in which ptxas spills none), FlashAttention-3's
// order: P^T and dS^T (score_gradients, both products waited for), dS^T to shared memory, dV_j's
// product issued (L12) and left running across the barrier that completes dS^T; dQ_i's product
// (L15) issued behind it; once dV_j's is done, dK_j's (L16) behind dQ_i's; once dQ_i's is done, its
// block goes to shared memory and the copy engine's reduce-add (add_dq_block) while dK_j's product
// runs. The kernel's own step waits for dV_j's and dK_j's products before the barrier, and for
// dQ_i's before its block is written. A warpgroup that sees none of the tile still computes its dQ_i
// block (over both warpgroups' keys) with a zero dS^T for its own. Every wgmma is waited for inside
// the branch that issued it (ptxas serializes the kernel's wgmmas otherwise: docs/cuda_fa3.md), so
// the two branches meet the barrier at two places: kScoreGradientsDone, unaligned.
template <class Cfg, bool kBlockMask, class KeyColumn>
__device__ __forceinline__ void step_dq_overlapped(
    const Fa3BackwardParams& params, float (&dK)[Cfg::Dw / 8][4], float (&dV)[Cfg::Dw / 8][4],
    const typename Cfg::T* sK_j, const typename Cfg::T* sV_j, const typename Cfg::T* sQ_i,
    const typename Cfg::T* sdO_i, const float* sL_i, const float* sD_i, typename Cfg::T* sdS,
    float* sdQ, TileVisibility seen, TileRange rows, TileRange wg_cols,
    const KeyColumn& key_column, int b, int h, int wg, int wg_warp, int key0, int lane,
    Fa3BackwardBarriers* bars, std::uint32_t step_parity) {
    using T = typename Cfg::T;
    constexpr int Br = Cfg::Br, kPanels = Cfg::kPanels;
    // The warpgroup's keys (64 wg ..) and its one dQ_i block: rows 64 rb .., columns 64 cb ...
    const int k_rows = 64 * wg * 64, rb = wg / kPanels, cb = wg % kPanels;
    float* staging = sdQ + wg * Cfg::kDqBlockFloats;
    float acc[Cfg::kDqAccTiles][4];
    const auto store_dS = [&](const std::uint32_t(&adS)[Br / 16][4]) {
        if constexpr (Cfg::kDqTransposed)
            store_score_gradients_transposed<Cfg>(sdS, adS, key0, lane);
        else
            store_score_gradients<Cfg>(sdS, adS, key0, lane);
    };
    if (seen != TileVisibility::none) {
        std::uint32_t aP[Br / 16][4], adS[Br / 16][4];
        {
            float S[Br / 8][4], dP[Br / 8][4];
            score_gradients<Cfg, Br, kBlockMask>(S, dP, sK_j + k_rows, sV_j + k_rows, sQ_i, sdO_i,
                                                 sL_i, sD_i, params.base, seen, rows, wg_cols,
                                                 key_column, lane);
            pack_a<T, Br / 16>(aP, S);
            pack_a<T, Br / 16>(adS, dP);
        }
        store_dS(adS);
        issue_a_regs_b<T, Br / 16, kPanels>(dV, aP, sdO_i, Br * 64);  // L12
        hopper::fence_proxy_async();  // dS^T's stores, read next by the tensor cores
        // dS^T complete.
        hopper::named_barrier_sync_unaligned(kScoreGradientsDone, Cfg::kComputeThreads);
        issue_dq_block<Cfg>(acc, sdS, sK_j, rb, cb);
        hopper::wgmma_wait<1>();  // dV_j's product is done (aP free); dQ_i's may still run
        hopper::wgmma_fence_registers(dV);
        hopper::wgmma_fence_registers(aP);
        issue_a_regs_b<T, Br / 16, kPanels>(dK, adS, sQ_i, Br * 64);  // L16
        hopper::wgmma_wait<1>();  // dQ_i's product is done; dK_j's may still run
        hopper::wgmma_fence_registers(acc);
        add_dq_block<Cfg, false>(params, staging, acc, b, h, rows.begin + 64 * rb, 64 * cb, wg,
                                 wg_warp, lane, bars, step_parity);
        hopper::wgmma_wait<0>();
        hopper::wgmma_fence_registers(dK);
        hopper::wgmma_fence_registers(adS);
    } else {
        const std::uint32_t zero[Br / 16][4] = {};
        store_dS(zero);
        hopper::fence_proxy_async();
        hopper::named_barrier_sync_unaligned(kScoreGradientsDone, Cfg::kComputeThreads);
        issue_dq_block<Cfg>(acc, sdS, sK_j, rb, cb);
        hopper::wgmma_wait<0>();
        hopper::wgmma_fence_registers(acc);
        add_dq_block<Cfg, false>(params, staging, acc, b, h, rows.begin + 64 * rb, 64 * cb, wg,
                                 wg_warp, lane, bars, step_parity);
    }
}

// ---- the kernel ------------------------------------------------------------------------------
// Grid: (Tc, batch x K/V heads), its CTAs in scheduled_tile's order (common/tiling.hpp): the key
// tiles of one K/V head side by side, key tile 0 (the most query tiles under a causal mask) first,
// and the last `tail` heads' key tiles longest first across them.
// Block: Cfg::kThreads (without a producer every warpgroup computes and thread 0 also issues the
// TMA copies; with one, warpgroup 0 copies and the two after it compute). Dynamic shared memory:
// backward_smem_bytes<Cfg>().
template <class Cfg, bool kBlockMask, bool kDeterministic>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fa3_backward_kernel(const __grid_constant__ Fa3BackwardParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(!Cfg::kProducer || (!kBlockMask && !kDeterministic),
                  "with a block mask or in deterministic mode the launch runs the tile without a "
                  "producer (cuda/fa3/backward.cu's run_variant)");
    using T = typename Cfg::T;
    constexpr int Br = Cfg::Br, Bc = Cfg::Bc, D = Cfg::D, Dw = Cfg::Dw, kPanels = Cfg::kPanels;
    extern __shared__ uint4 smem_raw[];
    const std::uintptr_t raw = reinterpret_cast<std::uintptr_t>(smem_raw);
    T* sK = reinterpret_cast<T*>((raw + 1023) & ~std::uintptr_t(1023));
    T* sV = sK + Bc * D;
    T* sQ = sV + Bc * D;                  // kSlots slots of Br x D
    T* sdO = sQ + Cfg::kSlots * Br * D;  // kSlots slots of Br x D
    T* sdS = sdO + Cfg::kSlots * Br * D;  // kScoreGradientBuffers x Bc x Br
    T* sP = sdS + Cfg::kScoreGradientBuffers * Bc * Br;  // Bc x Br (kQuerySplit), else none
    float* sdQ = reinterpret_cast<float*>(sP + (Cfg::kQuerySplit ? Bc * Br : 0));  // kDqBlocks x 64 x 64 (or none)
    float* sL = sdQ + (Cfg::kDqInSlot ? 0 : Cfg::kDqBlocks) * Cfg::kDqBlockFloats;  // kSlots x Br
    float* sDelta = sL + Cfg::kSlots * Br;
    auto* bars = reinterpret_cast<Fa3BackwardBarriers*>(sDelta + Cfg::kSlots * Br);

    const BackwardParams& bp = params.base;
    const AttentionProblem& p = bp.problem;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    // wg numbers the computing warpgroups (the producer's is -1), tid the computing threads.
    constexpr int kProducerThreads = Cfg::kProducer ? 128 : 0;
    const int wg = warp / 4 - kProducerThreads / 128, wg_warp = warp % 4;
    const int tid = int(threadIdx.x) - kProducerThreads;
    // The warpgroup's group of 64 keys, and its share of the columns of dK_j and dV_j (0 but at
    // D = 256: Fa3BackwardTile).
    const int key_group = wg / Cfg::kColumnGroups, column_group = wg % Cfg::kColumnGroups;
    const int seq_q = int(p.seq_q), seq_kv = int(p.seq_kv);
    const int Tr = int(tile_count(seq_q, Br));

    // L5: key tile j of K/V head g, batch b; its query heads are h0 .. h0 + G - 1. Warpgroup wg
    // owns keys wg_key0 .. wg_key0 + 63, its warp wg_warp 16 of them. Head and batch indices in 32
    // bits (fa3_check_backward_problem keeps them there): 64-bit ones took registers that the
    // kernel then spilled at d = 64 (docs/cuda_fa3.md has ptxas's counts).
    const ScheduledTile<int> sched = scheduled_tile(int(blockIdx.y * gridDim.x + blockIdx.x),
                                                    int(gridDim.x), int(gridDim.y), params.tail);
    const int j = sched.rank;  // under a causal mask key tile 0 sees the most query tiles
    const int b = sched.unit / int(p.heads_kv), g = sched.unit % int(p.heads_kv);
    const int G = int(p.group_size()), h0 = g * G;
    const TileRange cols = {j * Bc, min(j * Bc + Bc, seq_kv)};
    const int wg_key0 = j * Bc + 64 * key_group;
    const TileRange wg_cols = {min(wg_key0, seq_kv), min(wg_key0 + 64, seq_kv)};
    const int key0 = 64 * key_group + 16 * wg_warp;  // this warp's first key within the tile

    if (threadIdx.x == 0) bars->init(Cfg::kStepArrivals, Cfg::kComputeThreads), bars->key_tile = j;
    __syncthreads();
    // j inside the step loop, read from shared memory where it is used. Held in a register, ptxas
    // computed every key index the mask and the statistics need (j Bc + key0 + ...) once, before
    // the loop, and kept them live across it, more registers than a thread has: they were
    // spilled (docs/cuda_fa3.md, "The key tile read where it is used", has ptxas's counts).
    const auto key_tile = [&] { return *static_cast<volatile int*>(&bars->key_tile); };
    const auto key_column = [&] { return key_tile() * Bc + key0; };  // the warp's first key

    // L6: K_j, V_j, once (rows past N_kv arrive as zeros).
    if (threadIdx.x == 0) {
        hopper::mbarrier_arrive_expect_bytes(&bars->kv, 2 * Cfg::kKeyTileBytes);
#pragma unroll
        for (int pn = 0; pn < kPanels; ++pn) {  // map coordinates: column, row, head, batch entry
            hopper::tma_load_4d(sK + pn * Bc * 64, &params.k, &bars->kv, 64 * pn, j * Bc, int(g),
                                int(b));
            hopper::tma_load_4d(sV + pn * Bc * 64, &params.v, &bars->kv, 64 * pn, j * Bc, int(g),
                                int(b));
        }
    }
    // A dependent launch (cuda/fa3/backward.cu): this CTA may run while the D pass before it
    // ends. K_j and V_j are the caller's inputs, written before the D pass (an ordinary launch)
    // began, so they are asked for first; D_i, which the steps load, and dQ's sum, which the D
    // pass zeroes, only after the D pass has finished. The dQ pass after this kernel may be
    // placed as soon as every CTA has started (it waits for the grid's end itself).
    cuda::allow_dependent_launch();
    cuda::wait_for_prerequisite_grid();

    // L9 for step (h, i) into ring slot `slot`: Q_i and dO_i by TMA (one thread).
    const auto copy_step_tiles = [&](int slot, int h, int i) {
        hopper::mbarrier_arrive_expect_bytes(&bars->step[slot], Cfg::kStepBytes);
#pragma unroll
        for (int pn = 0; pn < kPanels; ++pn) {
            hopper::tma_load_4d(sQ + slot * Br * D + pn * Br * 64, &params.q, &bars->step[slot],
                                64 * pn, i * Br, h, b);
            hopper::tma_load_4d(sdO + slot * Br * D + pn * Br * 64, &params.dO, &bars->step[slot],
                                64 * pn, i * Br, h, b);
        }
    };
    // Without a producer: the tiles by thread 0, L_i and D_i by cp.async (every thread; committed
    // by the caller).
    const auto load_step = [&](int slot, int h, int i) {
        if (threadIdx.x == 0) copy_step_tiles(slot, h, i);
        cuda::load_row_statistics<Br, Cfg::kThreads>(bp, b, h, i, sL + slot * Br,
                                                     sDelta + slot * Br);
    };

    if constexpr (Cfg::kProducer) {
        if (wg < 0) {
            // The producer warpgroup. Its first warp walks the steps in the computing warpgroups'
            // order (cuda::next_step), kSlots of them ahead: once every computing thread has
            // released a slot, lane 0 asks TMA for the next step's Q_i and dO_i, and each lane
            // copies its share of L_i and D_i with cp.async, whose landing arrives on the slot's
            // barrier, so that the warp never waits for a load. (Loaded into registers and
            // stored, they held the producer back at its 24 registers, and the computing
            // warpgroups waited for their slots: docs/cuda_fa3.md measures it.) With a dQ warp
            // (Cfg::kDqWarp), lane 0 of its second warp hands the computing warpgroups' dQ_i
            // blocks to the copy engine (add_dq_blocks_issued). The other warps have nothing to do.
            hopper::release_registers<Cfg::kProducerRegisters>();
            if constexpr (Cfg::kDqWarp)
                if (warp == 1 && lane == 0)
                    add_dq_blocks_issued<Cfg>(params, bars, sdQ, cols, Tr, h0, G, b);
            if (warp != 0) return;
            RingPosition slot;
            int h = h0, i = -1;
            for (cuda::next_step(p, cols, Tr, Br, h0, G, h, i); h < h0 + G;
                 cuda::next_step(p, cols, Tr, Br, h0, G, h, i)) {
                hopper::mbarrier_wait(&bars->step_empty[slot.stage], slot.phase ^ 1);
                if (lane == 0) copy_step_tiles(slot.stage, h, i);
                cuda::load_row_statistics<Br, 32, true>(bp, b, h, i, sL + slot.stage * Br,
                                                        sDelta + slot.stage * Br, lane);
                cp_async_mbarrier_arrive(&bars->step[slot.stage]);
                slot.advance<Cfg::kSlots>();
            }
            cp_async_wait_all();
            return;
        }
        hopper::claim_registers<Cfg::kComputeRegisters>();
    }

    // L8: the steps (h, i), in cuda::next_step's order. Without a producer, also the kAhead =
    // kSlots - 1 steps after it (h_ask, i_ask, the next first): their tiles are asked for ahead,
    // step (h, i) starts once its own have landed and then asks for the last of h_ask, so that
    // while it runs the ring holds it and the kAhead steps after it. Past the last step,
    // h = h0 + G.
    constexpr int kAhead = Cfg::kSlots - 1;
    int h = h0;
    int i = -1;
    cuda::next_step(p, cols, Tr, Br, h0, G, h, i);
    int h_ask[kAhead];
    int i_ask[kAhead];
    if constexpr (!Cfg::kProducer) {
        if (h < h0 + G) load_step(0, h, i);
        cp_async_commit();
#pragma unroll
        for (int k = 0; k < kAhead; ++k) {
            h_ask[k] = k == 0 ? h : h_ask[k - 1];
            i_ask[k] = k == 0 ? i : i_ask[k - 1];
            if (h_ask[k] < h0 + G) cuda::next_step(p, cols, Tr, Br, h0, G, h_ask[k], i_ask[k]);
            if (k + 1 < kAhead) {
                if (h_ask[k] < h0 + G) load_step(k + 1, h_ask[k], i_ask[k]);
                cp_async_commit();  // one group per step, empty past the last
            }
        }
    }

    // L7: dK_j = 0, dV_j = 0: this warp's 16 keys x the warpgroup's Dw columns.
    float dK[Dw / 8][4], dV[Dw / 8][4];
    zero(dK);
    zero(dV);

    RingPosition ring;
    bool keys_landed = false;
    // dS^T's buffer of this step (by turns with a producer); with a producer, also the parity of
    // the step's phase of the dQ barriers (add_dq_block).
    int buffer = 0;
    while (h < h0 + G) {
        if constexpr (Cfg::kProducer) {
            // This step's slot is full (the producer asked for it as soon as it came free).
            hopper::mbarrier_wait(&bars->step[ring.stage], ring.phase);
            if (!keys_landed) hopper::mbarrier_wait(&bars->kv, 0);
            keys_landed = true;
        } else {
            // This step's tiles have landed, and every warpgroup is done with the previous step
            // (its slot, which the next copy overwrites, and dS^T, which this step rewrites); with
            // the dQ blocks in that slot, the copy engine has read them.
            if constexpr (Cfg::kDqInSlot)
                if (wg_warp == 0 && lane == 0) hopper::bulk_wait_read<0>();
            cp_async_wait<Cfg::kSlots - 2>();
            hopper::mbarrier_wait(&bars->step[ring.stage], ring.phase);
            if (!keys_landed) hopper::mbarrier_wait(&bars->kv, 0);
            keys_landed = true;
            __syncthreads();
            if (h_ask[kAhead - 1] < h0 + G)
                load_step((ring.stage + kAhead) % Cfg::kSlots, h_ask[kAhead - 1], i_ask[kAhead - 1]);
            cp_async_commit();
        }
        T* const sdS_step = sdS + buffer * Bc * Br;

        const T* sQ_i = fresh(sQ) + ring.stage * Br * D;
        const T* sdO_i = fresh(sdO) + ring.stage * Br * D;
        const T* sK_j = fresh(sK);
        const T* sV_j = fresh(sV);
        const TileRange rows = {i * Br, min(i * Br + Br, seq_q)};
        const TileVisibility seen = wg_cols.size() > 0
                                        ? mma::visibility<kBlockMask>(p, rows, wg_cols)
                                        : TileVisibility::none;
        if constexpr (Cfg::kOverlapDq && !kDeterministic && !kBlockMask) {
            step_dq_overlapped<Cfg, kBlockMask>(params, dK, dV, sK_j, sV_j, sQ_i, sdO_i,
                                                sL + ring.stage * Br, sDelta + ring.stage * Br,
                                                sdS_step, sdQ, seen, rows, wg_cols, key_column, b, h,
                                                wg, wg_warp, key0, lane, bars, buffer);
        } else {
            // dV_j and dK_j's columns Dw column_group ..: panels Dw / 64 column_group ..
            constexpr int kWgPanels = Dw / 64;
            const int d_panel0 = kWgPanels * column_group * Br * 64;
            if constexpr (Cfg::kQuerySplit) {
                // Warpgroup wg's queries of the tile: Brw wg .. Brw wg + Brw - 1 (Fa3BackwardTile).
                constexpr int Brw = Cfg::Brw;
                const int q0 = Brw * wg;
                const TileRange wg_rows = {min(rows.begin + q0, rows.end),
                                           min(rows.begin + q0 + Brw, rows.end)};
                const TileVisibility wg_seen = seen != TileVisibility::none && wg_rows.size() > 0
                                                   ? mma::visibility<kBlockMask>(p, wg_rows, wg_cols)
                                                   : TileVisibility::none;
                if (wg_seen != TileVisibility::none) {
                    float S[Brw / 8][4], dP[Brw / 8][4];
                    score_gradients<Cfg, Brw, kBlockMask>(
                        S, dP, sK_j, sV_j, sQ_i + q0 * 64, sdO_i + q0 * 64, sL + ring.stage * Br + q0,
                        sDelta + ring.stage * Br + q0, bp, wg_seen, wg_rows, wg_cols, key_column, lane);
                    std::uint32_t aP[Brw / 16][4], adS[Brw / 16][4];
                    pack_a<T, Brw / 16>(aP, S);
                    pack_a<T, Brw / 16>(adS, dP);
                    store_score_gradients<Cfg, Brw>(sP, aP, key0, lane, q0);
                    store_score_gradients<Cfg, Brw>(sdS_step, adS, key0, lane, q0);
                } else {
                    const std::uint32_t zero[Brw / 16][4] = {};
                    store_score_gradients<Cfg, Brw>(sP, zero, key0, lane, q0);
                    store_score_gradients<Cfg, Brw>(sdS_step, zero, key0, lane, q0);
                }
                hopper::fence_proxy_async();  // P^T's and dS^T's stores, read next by the tensor cores
                __syncthreads();              // both halves complete
                if (seen != TileVisibility::none) {
                    issue_a_smem_b<T, Br / 16>(dV, fresh(sP), Bc * 64, sdO_i + d_panel0, Br * 64);  // L12
                    issue_a_smem_b<T, Br / 16>(dK, fresh(sdS_step), Bc * 64, sQ_i + d_panel0, Br * 64);  // L16
                    hopper::wgmma_wait<0>();
                    hopper::wgmma_fence_registers(dV);
                    hopper::wgmma_fence_registers(dK);
                }
            } else {
                if (seen != TileVisibility::none) {
                    float S[Br / 8][4], dP[Br / 8][4];
                    const int k_rows = 64 * key_group * 64;
                    score_gradients<Cfg, Br, kBlockMask>(S, dP, sK_j + k_rows, sV_j + k_rows, sQ_i,
                                                         sdO_i, sL + ring.stage * Br,
                                                         sDelta + ring.stage * Br, bp, seen, rows,
                                                         wg_cols, key_column, lane);
                    std::uint32_t aP[Br / 16][4], adS[Br / 16][4];
                    pack_a<T, Br / 16>(aP, S);
                    issue_a_regs_b<T, Br / 16, kWgPanels>(dV, aP, sdO_i + d_panel0, Br * 64);  // L12
                    pack_a<T, Br / 16>(adS, dP);
                    issue_a_regs_b<T, Br / 16, kWgPanels>(dK, adS, sQ_i + d_panel0, Br * 64);  // L16
                    store_score_gradients<Cfg>(sdS_step, adS, key0, lane);
                    hopper::wgmma_wait<0>();
                    hopper::wgmma_fence_registers(dV);
                    hopper::wgmma_fence_registers(dK);
                    hopper::wgmma_fence_registers(aP);
                    hopper::wgmma_fence_registers(adS);
                } else {
                    const std::uint32_t zero[Br / 16][4] = {};
                    store_score_gradients<Cfg>(sdS_step, zero, key0, lane);
                }
            }
            hopper::fence_proxy_async();  // dS^T's stores, read next by the tensor cores
            // dS^T complete (kQuerySplit: every product done with the step's slot).
            if constexpr (Cfg::kProducer)
                hopper::named_barrier_sync(kScoreGradientsDone, Cfg::kComputeThreads);
            else
                __syncthreads();

            // L15: dQ_i += scale dS K_j; in kDeterministic mode after the key tiles before this one.
            int* turn = nullptr;
            if constexpr (kDeterministic)
                turn = cuda::wait_dq_turn<kBlockMask>(bp, b, h, Tr, i, rows, key_tile(), Bc);
            // Warpgroup wg's blocks wg kPer .. wg kPer + kPer - 1, block c: rows 64 (c / kPanels) ..,
            // columns 64 (c % kPanels) .., keys 0 .. Bc - 1. Where every warpgroup has a block the
            // test is left out at compile time: a branch around a wgmma measured ~20% slower at
            // d = 128.
            constexpr int kPer = Cfg::kDqBlocksPerWarpgroup;
            if (Cfg::kDqBlocks >= Cfg::kWarpgroups || wg < Cfg::kDqBlocks) {
                // One block at a time (32 accumulators; with both of d = 256's blocks in registers
                // at once ptxas spilled 316 bytes per thread, against 12 so), each first written to
                // the warpgroup's own area of sdQ, or at D = 256 (kDqInSlot) to this step's slot:
                // warpgroup 0's blocks to its Q_i, warpgroup 1's to its dO_i (32 KB each).
    #pragma unroll 1
                for (int q = 0; q < kPer; ++q) {
                    const int rb = (wg * kPer + q) / kPanels, cb = (wg * kPer + q) % kPanels;
                    float acc[8][4];
                    issue_mn_major<T, Bc / 16>(acc, fresh(sdS_step) + rb * Bc * 64,
                                               fresh(sK) + cb * Bc * 64);
                    hopper::wgmma_wait<0>();
                    hopper::wgmma_fence_registers(acc);
                    float* staging = sdQ + (wg * kPer + q) * Cfg::kDqBlockFloats;
                    if constexpr (Cfg::kDqInSlot)
                        staging = reinterpret_cast<float*>((wg == 0 ? sQ : sdO) + ring.stage * Br * D) +
                                  q * Cfg::kDqBlockFloats;
                    add_dq_block<Cfg, kDeterministic>(params, staging, acc, b, h, rows.begin + 64 * rb,
                                                      64 * cb, wg, wg_warp, lane, bars, buffer);
                }
            }
            if constexpr (kDeterministic) cuda::pass_dq_turn(turn);
        }
        if constexpr (Cfg::kProducer) {
            hopper::mbarrier_arrive(&bars->step_empty[ring.stage]);  // the slot is the producer's
            buffer ^= 1;
            cuda::next_step(p, cols, Tr, Br, h0, G, h, i);
        } else {
            h = h_ask[0], i = i_ask[0];
#pragma unroll
            for (int k = 0; k < kAhead; ++k) {
                if (k + 1 < kAhead) {
                    h_ask[k] = h_ask[k + 1], i_ask[k] = i_ask[k + 1];
                } else if (h_ask[k] < h0 + G) {
                    cuda::next_step(p, cols, Tr, Br, h0, G, h_ask[k], i_ask[k]);
                }
            }
        }
        ring.advance<Cfg::kSlots>();
    }
    cp_async_wait_all();
    // A CTA with no step must not end while its K_j, V_j copy is still writing its shared memory,
    // nor while the copy engine is still reading a dQ block.
    if (!keys_landed) hopper::mbarrier_wait(&bars->kv, 0);
    hopper::bulk_wait_read<0>();

    // L18. Q was read times q_sign (so S^T had the right sign): dK's scale is |scale|. Staged in
    // K_j's shared memory, once every warpgroup's products reading it are done (the barrier).
    if (params.key_gradients_staged) {
        sync_compute_threads<Cfg>();
        auto* stage = reinterpret_cast<unsigned char*>(sK);
        const int jt = key_tile(), col0 = Dw * column_group;
        store_key_gradient_staged<Cfg>(bp.dK, bp.dk_layout, dK, bp.abs_scale, stage, b, g, jt,
                                       seq_kv, key0, tid, lane, col0);
        store_key_gradient_staged<Cfg>(bp.dV, bp.dv_layout, dV, 1.0f, stage, b, g, jt, seq_kv,
                                       key0, tid, lane, col0);
    } else {
        cuda::write_key_gradients<Dw>(bp, dK, dV, bp.abs_scale, b, g, key_tile() * Bc + key0,
                                      lane, Dw * column_group);
    }
#endif
}

}  // namespace flashattn::fa3
