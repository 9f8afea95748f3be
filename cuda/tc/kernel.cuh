// cuda/tc/kernel.cuh — cuda-tc: FlashAttention-2 forward on tensor cores (fp16 / bf16 Q, K, V;
// fp32 accumulation, softmax, O and LSE). The loop, the masks, the softmax and the epilogue are
// cuda/stages/flash_forward.cuh's, written once for cuda-tc and cuda-fa2's 3xTF32 kernel (its
// header maps FlashAttention-2's Algorithm 1 line by line); this file holds cuda-tc's operand
// stages: how 16-bit tiles are laid out, copied (L4, L7) and multiplied (L8, L10), gathered in
// TcForwardOps. The host side that picks a tile shape and launches it is cuda/tc/forward.cu;
// cuda-tc's backward (cuda/tc/backward_ops.cuh) reuses these stages.
//
// What changed from a plain FlashAttention-2 kernel (one thread per query row, fp32 dot products,
// e.g. cuda-fa2), and why:
//
//  * Who owns what. A CTA of kWarps warps owns Br query rows; each warp owns kMTiles row tiles of
//    16 rows (one row of m16n8k16 tiles each). Its O_i, m_i and l_i live in that warp's registers,
//    spread over the lanes in the C-fragment layout (see cuda/ptx/mma_sync.cuh): lane (g, t) holds
//    rows g and g + 8, columns 2t, 2t+1 of every 8-column block. So a row's values are shared by
//    the 4 lanes of a "quad", and a row reduction (max, sum) is 2 shuffles, not a loop over d. With
//    2 row tiles per warp (as in FlashAttention-2; the default at d <= 64, where it fits the
//    registers) every K_j / V_j fragment a warp reads from shared memory feeds two mma's, which
//    halves the shared-memory traffic per FLOP.
//  * Both products on tensor cores. S = Q_i K_j^T and P~ V_j are sums of mma.sync m16n8k16
//    products (16-bit inputs, fp32 accumulators). The operands come from shared memory through
//    ldmatrix, which delivers them already in fragment order (.trans for V, which is stored
//    row-major but is the "col" operand of P V).
//  * P~ never touches shared memory: the fp32 S accumulators of two neighbouring 8-column tiles
//    are exactly one A fragment of P~ once rounded to 16 bits (cuda/ptx/mma_sync.cuh draws why), so
//    online_softmax overwrites S with P~ in place and accumulate_pv packs it and multiplies.
//  * Q_i is read from shared memory once and kept in registers (as A fragments) for the whole
//    j loop when it fits (d kMTiles <= 128); otherwise its fragments are re-read per tile.
//  * Copies overlap the math: K_j, V_j arrive through cp.async (global -> shared without passing
//    through registers) into a ring of kStages buffers; tile j + kStages - 1 is in flight while
//    tile j is multiplied. Ragged tails are zero-filled by the copy itself.
//  * No bank conflicts: every tile row is d 16-bit values = d/8 chunks of 16 bytes, and chunk c of
//    row r is stored at chunk c ^ f(r) (swizzled_chunk). ldmatrix reads one chunk column of 8
//    consecutive rows per 8x8 block; the XOR spreads those 8 chunks over all 32 banks.
//  * exp via exp2: the scale is not applied to S; exp(scale (s - m)) = 2^(s c - m c) with
//    c = scale log2(e), one FMA and one MUFU.EX2 per score (exp2_shifted,
//    common/online_softmax.hpp).
//  * l_i is kept per lane (a partial row sum over the lane's columns) and summed over the quad only
//    once, in write_output: the rescale factor is the same for the whole row, so partial sums
//    rescale independently.
//  * Masks cost nothing where they cannot apply: classify_causal / classify_tile
//    (common/tiling.hpp) tell, per warp and key tile, whether the tile is fully visible (no
//    per-element test), partly visible (mask_scores writes -inf), or invisible (skipped: with
//    causal masking the j loop stops at the diagonal; with a block mask invisible tiles are neither
//    loaded nor multiplied). Block masks get their own kernel instance (kBlockMask), so the others
//    carry none of that code.
//  * Reductions as trees: a lane's row maximum and row sum over its Bc/4 entries take log2(Bc/4)
//    dependent steps instead of a chain of Bc/4 (measured +3-8% at d = 64, docs/cuda_tc.md).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/stages/flash_forward.cuh"
#include "cuda/stages/mma_stages.cuh"
#include "cuda/ptx/dependent_launch.cuh"
#include "cuda/ptx/mma_sync.cuh"

namespace flashattn::tc {

using mma::KernelParams;
using mma::make_params;

// The compile-time shape of one CTA's work.
template <class T_, int D_, int kWarps_, int kMTiles_, int Bc_, int kStages_>
struct TcTile {
    using T = T_;                             // __half or __nv_bfloat16
    static constexpr int D = D_;              // head dimension d
    static constexpr int kWarps = kWarps_;
    static constexpr int kMTiles = kMTiles_;  // m16 row tiles per warp: 16 kMTiles query rows
    static constexpr int kWarpRows = 16 * kMTiles_;
    static constexpr int Br = kWarpRows * kWarps_;  // query rows per CTA
    static constexpr int Bc = Bc_;                  // key rows per tile K_j, V_j
    static constexpr int kStages = kStages_;        // K_j, V_j buffers in the cp.async ring
    static constexpr int kThreads = 32 * kWarps_;
    static constexpr int kChunks = D_ / 8;  // 16-byte chunks per tile row
    // Q_i's A fragments take D kMTiles / 4 registers per thread; beside O_i (D kMTiles / 2) and
    // S (Bc kMTiles / 2) they fit up to D kMTiles = 128. Beyond, Q_i is re-read from shared memory.
    static constexpr bool kQInRegisters = D_ * kMTiles_ <= 128;
    static constexpr int kSmemBytes = (Br + 2 * kStages_ * Bc_) * D_ * int(sizeof(T_));

    static_assert(D_ % 32 == 0 && D_ <= 256, "d must be a multiple of 32 up to 256");
    static_assert(Bc_ % 16 == 0, "Bc must be a multiple of the mma k = 16");
    static_assert(kStages_ >= 2, "the ring needs at least a tile in use and one in flight");
};

// ---- shared-memory layout ----------------------------------------------------------------------

// Index (in 16-byte chunks) of chunk c of row r in a swizzled tile of kChunks chunks per row.
// ldmatrix reads chunk c of 8 consecutive rows at once; XOR-ing c with a function of r that takes
// 8 different values over those rows puts the 8 chunks in 8 different 16-byte bank groups.
//   * kChunks a multiple of 8 (d = 64, 128, 256): a row spans whole 128-byte lines, f(r) = r % 8.
//   * kChunks = 4 or 12 (d = 32, 96): two rows share a 128-byte line (row r starts 64 bytes into
//     it when r is odd), so f(r) = (r / 2) % 4 on the low two bits, and the line half does the
//     rest.
template <int kChunks>
__device__ __forceinline__ int swizzled_chunk(int r, int c) {
    static_assert(kChunks % 8 == 0 || kChunks % 8 == 4, "d/8 must be a multiple of 4");
    if constexpr (kChunks % 8 == 0)
        return r * kChunks + (c ^ (r & 7));
    else
        return r * kChunks + (c ^ ((r >> 1) & 3));
}

// FA2 L4 / L7: copy rows [row0, row0 + kRows) of one head's contiguous (n x D) matrix into a
// swizzled tile, 16 bytes per cp.async; rows at or past n (the ragged last tile) are zero-filled.
// cuda-tc reads contiguous arrays only (its Backend has no device_layouts), so the row stride is
// the compile-time D: taken from the layouts at run time instead, the forward ran 3-4% slower
// (docs/python.md, "cuda-fa2 on views where they lie").
template <class Cfg, int kRows>
__device__ __forceinline__ void load_tile(typename Cfg::T* tile, const typename Cfg::T* src,
                                          int row0, int n) {
    constexpr int kCopies = kRows * Cfg::kChunks;
#pragma unroll
    for (int k = 0; k < (kCopies + Cfg::kThreads - 1) / Cfg::kThreads; ++k) {
        const int idx = int(threadIdx.x) + k * Cfg::kThreads;
        if (kCopies % Cfg::kThreads == 0 || idx < kCopies) {
            const int r = idx / Cfg::kChunks;
            const int c = idx % Cfg::kChunks;
            const bool valid = row0 + r < n;
            const typename Cfg::T* from =
                valid ? src + std::int64_t(row0 + r) * Cfg::D + 8 * c : src;
            cp_async_16(tile + swizzled_chunk<Cfg::kChunks>(r, c) * 8, from, valid);
        }
    }
}

// ---- the two products ------------------------------------------------------------------------

// The A fragment of one 16 x 16 block of Q_i: row tile mt of this warp, columns 16 kk .. +15.
// Lane l points at row l % 16 of the block, chunk 2 kk + l / 16, so the 8x8 blocks
// (rows 0-7 | 8-15) x (cols 0-7 | 8-15) arrive as a0, a1, a2, a3.
template <class Cfg>
__device__ __forceinline__ void load_q_fragment(std::uint32_t (&a)[4], const typename Cfg::T* sQ,
                                                int warp, int mt, int kk, int lane) {
    const int row = warp * Cfg::kWarpRows + 16 * mt + lane % 16;
    ldmatrix_x4(a, sQ + swizzled_chunk<Cfg::kChunks>(row, 2 * kk + lane / 16) * 8);
}

// FA2 L4 (end): Q_i from shared memory into registers, once, for the whole j loop.
template <class Cfg>
__device__ __forceinline__ void load_q_fragments(
    std::uint32_t (&q)[Cfg::kMTiles][Cfg::D / 16][4], const typename Cfg::T* sQ, int warp,
    int lane) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < Cfg::D / 16; ++kk)
            load_q_fragment<Cfg>(q[mt][kk], sQ, warp, mt, kk, lane);
}

// FA2 L8: S_ij = Q_i K_j^T for this warp's rows: per row tile, Bc/8 accumulator tiles of 16 x 8.
// K_j is stored row-major (key, d), which is already the "col" layout B wants (k = d contiguous),
// so plain ldmatrix gives B fragments. One ldmatrix.x4 covers 16 keys x 16 dims: lane l points at
// key 16 nn + l % 8 + 8 (l / 16), chunk 2 kk + (l / 8) % 2, giving (b0, b1) of key tile 2 nn and
// (b0, b1) of key tile 2 nn + 1. Each B fragment serves all kMTiles row tiles of the warp.
template <class Cfg>
__device__ __forceinline__ void compute_scores(
    float (&S)[Cfg::kMTiles][Cfg::Bc / 8][4], const std::uint32_t (&q)[Cfg::kMTiles][Cfg::D / 16][4],
    const typename Cfg::T* sQ, const typename Cfg::T* sK, int warp, int lane) {
#pragma unroll
    for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < Cfg::Bc / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[mt][nt][e] = 0.0f;
    // With Q_i in registers the kk loop must unroll fully (q is indexed by kk). Re-read from shared
    // memory, a loop unrolled twice keeps the compiler from hoisting every fragment of Q_i and K_j
    // at once, which would spill registers at d = 128 (measured: 372 -> 72 bytes of spills).
    constexpr int kUnrollK = Cfg::kQInRegisters ? Cfg::D / 16 : 2;
#pragma unroll kUnrollK
    for (int kk = 0; kk < Cfg::D / 16; ++kk) {
        std::uint32_t a[Cfg::kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
            if constexpr (Cfg::kQInRegisters) {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[mt][e] = q[mt][kk][e];
            } else {
                load_q_fragment<Cfg>(a[mt], sQ, warp, mt, kk, lane);
            }
        }
#pragma unroll
        for (int nn = 0; nn < Cfg::Bc / 16; ++nn) {
            std::uint32_t b[4];
            const int key = 16 * nn + lane % 8 + 8 * (lane / 16);
            ldmatrix_x4(b, sK + swizzled_chunk<Cfg::kChunks>(key, 2 * kk + (lane / 8) % 2) * 8);
#pragma unroll
            for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
                mma_m16n8k16<typename Cfg::T>(S[mt][2 * nn], a[mt], b[0], b[1]);
                mma_m16n8k16<typename Cfg::T>(S[mt][2 * nn + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// FA2 L10 (second half): O_i += P~_ij V_j. P~ (fp32, in S's registers) is rounded to T and packed
// into A fragments: the accumulator tiles 2 kk and 2 kk + 1 (keys 16 kk .. 16 kk + 15) are
// (a0, a1) and (a2, a3). V_j is stored row-major (key, d), but in P V the key is the k index, so
// B needs V's columns: ldmatrix .trans. Lane l points at key 16 kk + l % 8 + 8 ((l / 8) % 2),
// chunk 2 dn + l / 16, giving (b0, b1) of output columns 16 dn .. +7 and of 16 dn + 8 .. +15.
template <class Cfg>
__device__ __forceinline__ void accumulate_pv(float (&O)[Cfg::kMTiles][Cfg::D / 8][4],
                                              const float (&P)[Cfg::kMTiles][Cfg::Bc / 8][4],
                                              const typename Cfg::T* sV, int lane) {
    using T = typename Cfg::T;
#pragma unroll
    for (int kk = 0; kk < Cfg::Bc / 16; ++kk) {
        std::uint32_t a[Cfg::kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
            accumulators_to_a_fragment<T>(a[mt], P[mt][2 * kk], P[mt][2 * kk + 1]);
        }
#pragma unroll
        for (int dn = 0; dn < Cfg::D / 16; ++dn) {
            std::uint32_t b[4];
            const int key = 16 * kk + lane % 8 + 8 * ((lane / 8) % 2);
            ldmatrix_x4_trans(b, sV + swizzled_chunk<Cfg::kChunks>(key, 2 * dn + lane / 16) * 8);
#pragma unroll
            for (int mt = 0; mt < Cfg::kMTiles; ++mt) {
                mma_m16n8k16<T>(O[mt][2 * dn], a[mt], b[0], b[1]);
                mma_m16n8k16<T>(O[mt][2 * dn + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// ---- the kernel ------------------------------------------------------------------------------

// cuda-tc's operand stages for the forward written once in cuda/stages/flash_forward.cuh.
// Shared memory (Cfg::kSmemBytes): Q_i (Br x D), then kStages K_j tiles (Bc x D), then kStages V_j
// tiles, all swizzled. Q_i's A fragments are kept in registers when they fit (kQInRegisters).
template <class Cfg_>
struct TcForwardOps {
    using Cfg = Cfg_;
    using Element = typename Cfg::T;  // __half or __nv_bfloat16 (Q already times q_sign)
    static constexpr bool kExactDifference = false;
    // A reference maximum moved only past keeps_reference_max's bound (FlashAttention-4's
    // conditional rescale), so that a warp skips O's rescale, D / 2 multiplications a row pair,
    // at most key tiles. Measured 1-4% faster at d = 128 and 256, 3% slower at d = 64
    // (docs/cuda_tc.md, "A reference maximum that rarely moves").
    static constexpr bool kLazyRescale = Cfg::D >= 128;
    static constexpr int Bc = Cfg::Bc, D = Cfg::D;

    Element* sQ;
    Element* sK;
    Element* sV;
    int warp, lane;
    std::uint32_t q[Cfg::kMTiles][D / 16][4];  // Q_i's A fragments (when kQInRegisters)

    __device__ __forceinline__ TcForwardOps(const KernelParams&, void* smem, int warp_, int lane_)
        : sQ(static_cast<Element*>(smem)),
          sK(sQ + Cfg::Br * D),
          sV(sK + Cfg::kStages * Bc * D),
          warp(warp_),
          lane(lane_) {}

    // The row strides flash_forward passes are D here (contiguous arrays: load_tile).
    __device__ __forceinline__ void load_q(const Element* Q_head, std::int64_t /*ld*/,
                                           int row_begin, int n) {
        load_tile<Cfg, Cfg::Br>(sQ, Q_head, row_begin, n);
    }
    __device__ __forceinline__ void load_kv(int slot, const Element* K_head, const Element* V_head,
                                            const QkvLayouts& /*at*/, int key_begin, int n) {
        load_tile<Cfg, Bc>(sK + slot * Bc * D, K_head, key_begin, n);
        load_tile<Cfg, Bc>(sV + slot * Bc * D, V_head, key_begin, n);
    }
    __device__ __forceinline__ void hold_q() {
        if constexpr (Cfg::kQInRegisters) load_q_fragments<Cfg>(q, sQ, warp, lane);
    }
    // fp16 / bf16 products take every value their inputs can hold: nothing to look at.
    __device__ __forceinline__ void inspect_skipped(int) {}
    __device__ __forceinline__ static constexpr bool computed_tile() { return true; }
    __device__ __forceinline__ void scores(float (&S)[Cfg::kMTiles][Bc / 8][4], int slot) const {
        compute_scores<Cfg>(S, q, sQ, sK + slot * Bc * D, warp, lane);
    }
    __device__ __forceinline__ void accumulate_pv(float (&O)[Cfg::kMTiles][D / 8][4],
                                                  const float (&P)[Cfg::kMTiles][Bc / 8][4],
                                                  int slot) const {
        tc::accumulate_pv<Cfg>(O, P, sV + slot * Bc * D, lane);
    }
};

// Grid: (Tr kv_splits, heads, batch). Block: Cfg::kThreads. Dynamic shared memory: Cfg::kSmemBytes.
// kSplitKV: a split-KV launch (params.kv_splits > 1; cuda/stages/flash_forward.cuh), whose
// combine may be launched at once (it waits for this grid: cuda/ptx/dependent_launch.cuh).
template <class Cfg, bool kBlockMask, bool kSplitKV>
__global__ void __launch_bounds__(Cfg::kThreads) tc_forward_kernel(const KernelParams params) {
    extern __shared__ uint4 smem[];  // uint4: 16-byte aligned, as cp.async and ldmatrix need
    if constexpr (kSplitKV) cuda::allow_dependent_launch();
    mma::flash_forward<TcForwardOps<Cfg>, kBlockMask, kSplitKV>(params, smem);
}

}  // namespace flashattn::tc
