// cuda/fa1/kernel_tf32.cuh — cuda-fa1 v5: Algorithm 1 of FlashAttention with lines 9 and 12 on
// tensor cores (3xTF32, cuda/ptx/tf32_mma.cuh), the loop order and the HBM round trips of O, l, m
// unchanged.
//
// Algorithm 1 (FlashAttention, Dao et al. 2022) and where each line is here:
//   line 1   Br, Bc from M                               host (fa1_plan in cuda/fa1/backend.cu)
//   line 2   O = 0, l = 0, m = -inf in HBM                start of the kernel
//   line 5   for each K/V block j                        the outer loop
//   line 6     load K_j, V_j to shared memory             all warps, cp.async
//   line 7     for each query block i                    16-row slices, spread over the warps
//   line 8       load Q_i, l_i, m_i (O_i in line 12)      Q_i slice -> shared, l_i, m_i -> registers
//   line 9       S_ij = scale Q_i K_j^T                   fa1_tf32_scores, then the scale + masks
//   line 10      m~, P~ = exp(S_ij - m~), l~              fa1_block_softmax (exp2_of_difference)
//   line 11      m_new, l_new = merge_softmax(...)        merge_softmax, per row
//   line 12      O_i = diag(l_new)^-1 (...) -> HBM        fa1_tf32_update_output (fa1_output_update)
//   line 13      l_i, m_i -> HBM                          after line 12
// The rule (exp2_of_difference, merge_softmax, fa1_output_update, log_sum_exp) is
// common/online_softmax.hpp's, called per element as in the scalar form (cpu/scalar.cpp) and in v3
// (cuda/fa1/backend.cu).
//
// Why v5 is built like cuda-fa2's tensor-core kernel: 3xTF32 products are as accurate as v3's
// fp32 FMAs and faster per FLOP, but only with long, independent mma chains per warp; a first
// tensor-core fa1 with short, dependent chains (S_ij through shared memory) was slower than v3
// (versions and measurements: docs/cuda_fp32_notes.md, section "cuda/fa1/kernel_tf32.cuh"). So:
//
//  * One warp owns a 16-row slice of Q_i and *all* Bc keys of K_j for the step: S_ij's 16 x Bc
//    scores stay in that warp's registers (mma accumulator layout) through lines 9-12, and the
//    row statistics of line 10 are a quad's shuffles, as in cuda-tc. Bc <= kMaxBc (256 at D = 64,
//    128 at D = 128: the registers S_ij takes); line 1 gives Bc = 227 at d = 64 and 114 at
//    d = 128 on an H100/H200 (M = 227 KiB). Larger Bc (small d, or a block-size sweep) runs v3.
//  * Line 7's loop: the rows of a thread block's query blocks are cut into 16-row slices, taken
//    by the warps in turn. A row's arithmetic in a step (its scores, m~, l~, merge and O update)
//    involves no other row, so which rows share a slice changes nothing in the result: a slice
//    may straddle two query blocks when Br is not a multiple of 16 (Br = 114 at d = 128).
//  * Line 12 in passes of kDN x 8 output columns: P~ V_j for those columns (a fresh accumulator
//    per 8-key k-step, added in fp32, as cuda-fa2 does for accuracy), O_i's old values for the
//    same columns (read before or after the products: Fa1Tf32Tile says which and why),
//    fa1_output_update, and the write. O_i never sits in registers whole.
//  * Q_i's slice goes to a per-warp area of shared memory (cp.async, zero-filled past d and past
//    the last row) and is read from there, split into tf32 pairs, once per 16 columns of d.
//  * K_j, V_j rows are zero-filled up to a multiple of 32 (the kernel works on groups of 4 key
//    tiles of 8, skipping whole groups past Bc): a zero V row times a zero P~ is 0. (Skipping
//    single tiles of the last group as well was measured 7% slower at d = 128: more code.)
//  * No double buffering of K_j, V_j: at line 1's Bc the two take half of M, and M is the whole
//    shared memory; the load at the top of each step of the j loop is the price (ncu at
//    d = 128: 15% of the warps' stall cycles are at that barrier).
//
// Where the time goes: waits on the split chains and on the fp32 adds after the mma's, and the
// barrier of each step (measurements: docs/cuda_fp32_notes.md, section "cuda/fa1/kernel_tf32.cuh").
//
// Inputs must be finite (the split turns inf into NaN) and d >= 16 (3xTF32's operands carry
// ~22 bits; why this bound: cuda/host/tensor_core_eligibility.hpp): cuda/fa1/backend.cu checks and
// runs v3 otherwise.
#pragma once

#include <cstdint>

#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/stages/async_copy.cuh"
#include "cuda/stages/warp_softmax.cuh"
#include "cuda/stages/mma_stages.cuh"
#include "cuda/ptx/tf32_mma.cuh"

namespace flashattn::cuda {

// The compile-time shape: padded head dim D, at most kMaxNT key tiles of 8 per step, kWarps warps.
// Three choices differ between D = 64 and D = 128 because the registers do (S_ij takes 128 of them
// at D = 64, 64 at D = 128); each was measured both ways (H100, docs/cuda_fp32_notes.md):
//   kDN_          output column tiles per pass of line 12: all 8 at D = 64 (one pass: with more,
//                 ptxas hoisted P~'s split out of the pass loop and spilled), 4 at D = 128 (4
//                 passes; 8 ran 27% slower there);
//   kReadOFirst_  O_i's old values read into registers before the products (D = 128: hides the
//                 read's latency) or asked into L2 before and read after them (D = 64: no
//                 registers to hold them; reading them first spilled and ran 5% slower);
//   kScoreUnroll_ k-steps of line 9 unrolled (D = 128: 4, 2-5% faster than 1; D = 64: 1, where
//                 2 ran 9% slower).
template <int D_, int kMaxNT_, int kWarps_, int kDN_, bool kReadOFirst_, int kScoreUnroll_>
struct Fa1Tf32Tile {
    static constexpr int kScoreUnroll = kScoreUnroll_;
    static constexpr bool kReadOFirst = kReadOFirst_;
    static constexpr int D = D_;
    static constexpr int kMaxNT = kMaxNT_;
    static constexpr int kMaxBc = 8 * kMaxNT_;  // the largest Bc this instantiation can run
    static constexpr int kGroup = 4;            // key tiles per group (32 keys)
    static constexpr int kDN = kDN_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = 32 * kWarps_;
    static constexpr int kQKStride = D_ + 16;  // floats between rows of Q and K_j (cuda/fa2/kernel_tf32.cuh)
    static constexpr int kVStride = D_ + 4;    // floats between rows of V_j

    // Shared memory for key blocks of bc keys: K_j, V_j (rows rounded up to a group), then one
    // 16-row Q slice per warp.
    __host__ __device__ static constexpr int padded_keys(int bc) { return (bc + 31) / 32 * 32; }
    static constexpr std::size_t smem_bytes(int bc) {
        return sizeof(float) * (std::size_t(padded_keys(bc)) * (kQKStride + kVStride) +
                                std::size_t(kWarps_) * 16 * kQKStride);
    }

    static_assert(D_ % 32 == 0, "rows of a multiple of 32 floats (bank arithmetic)");
    static_assert(kMaxNT_ % kGroup == 0 && D_ % (8 * kDN) == 0, "whole groups and passes");
};

// What the kernel reads (by value, in the constant bank).
struct Fa1Tf32Params {
    AttentionProblem problem;
    const float* Q;
    const float* K;
    const float* V;
    float* O;
    float* l;  // Algorithm 1's l and m in HBM, one per query row
    float* m;
    float* lse;
    int Br, Bc;          // line 1
    int row_groups;      // thread blocks per (batch, head), each owning whole query blocks
};

// Line 9 (the product): S = Q_i K_j^T, unscaled, for the warp's 16 rows and the groups of key
// tiles below bc. The k renumbering of cuda/ptx/tf32_mma.cuh: k-step 2 qd + step takes head dims
// 16 qd + 4t + 2 step and + 1 for lane t, one 8-byte load per row and step
// (cuda/fa2/kernel_tf32.cuh's tf32_scores loads 16 bytes for two steps; here that would keep 16
// more registers live beside S_ij's up to 128). One fresh accumulator per k-step, added in fp32.
template <class Cfg>
__device__ __forceinline__ void fa1_tf32_scores(float (&S)[Cfg::kMaxNT][4], const float* sQ_w,
                                                const float* sK, int bc, int lane) {
    constexpr int kG = Cfg::kGroup;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < Cfg::kMaxNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] = 0.0f;
#pragma unroll Cfg::kScoreUnroll
    for (int ks = 0; ks < Cfg::D / 8; ++ks) {
        const int col = 16 * (ks / 2) + 4 * t + 2 * (ks % 2);  // this lane's k = t and k = t + 4
        const float* q_lane = sQ_w + g * Cfg::kQKStride + col;
        const float* k_lane = sK + g * Cfg::kQKStride + col;  // key tile nt: + 8 nt rows
        const float2 q0 = *reinterpret_cast<const float2*>(q_lane);
        const float2 q8 = *reinterpret_cast<const float2*>(q_lane + 8 * Cfg::kQKStride);
        // A = (g, k = t) (g + 8, t) (g, t + 4) (g + 8, t + 4); B = (k = t, key g) (t + 4, g)
        const tf32::Split a[4] = {tf32::split(q0.x), tf32::split(q8.x), tf32::split(q0.y),
                                  tf32::split(q8.y)};
#pragma unroll
        for (int grp = 0; grp < Cfg::kMaxNT / kG; ++grp) {
            if (32 * grp >= bc) break;
            tf32::Split bk[kG][2];
#pragma unroll
            for (int n = 0; n < kG; ++n) {
                const float2 k = *reinterpret_cast<const float2*>(
                    k_lane + 8 * (kG * grp + n) * Cfg::kQKStride);
                bk[n][0] = tf32::split(k.x), bk[n][1] = tf32::split(k.y);
            }
            float part[kG][4] = {};
            tf32::mma_3xtf32<kG>(part, a, bk);
#pragma unroll
            for (int n = 0; n < kG; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[kG * grp + n][e] += part[n][e];
        }
    }
}

// Line 9 (the rest): S = scale S, and -inf for keys the row may not see: keys at or past the
// block's end col_end (padding of the last group, or the ragged last block), past the causal
// diagonal, or outside the block mask. Accumulator entry (nt, e) is row row0 + g + 8 (e / 2), key
// col0 + 8 nt + 2t + e % 2.
template <class Cfg, bool kBlockMask>
__device__ __forceinline__ void fa1_scale_and_mask(float (&S)[Cfg::kMaxNT][4],
                                                   const AttentionProblem& p, float scale,
                                                   bool masked, int row0, int col0, int col_end,
                                                   int bc, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const std::int64_t row = row0 + g + 8 * r;
        const std::int64_t last_key = p.last_causal_key(row, col_end);
        // Clamped to [-1, kMaxBc], the per-entry test is a 32-bit compare.
        const std::int64_t last64 = last_key - col0 - 2 * t;
        const int last = int(last64 < -1 ? -1 : (last64 > Cfg::kMaxBc ? Cfg::kMaxBc : last64));
#pragma unroll
        for (int nt = 0; nt < Cfg::kMaxNT; ++nt) {
            if (8 * nt >= bc) break;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& s = S[nt][2 * r + e];
                s *= scale;
                if (!masked) continue;
                bool visible = 8 * nt + e <= last;
                if constexpr (kBlockMask)
                    visible = visible && row < p.seq_q &&
                              p.block_visible(row, col0 + 8 * nt + 2 * t + e);
                if (!visible) s = -INFINITY;
            }
        }
    }
}

// Line 10 for the warp's two rows per lane (g and g + 8): m~ = rowmax(S_ij) (the lane's entries,
// then the quad's 4 lanes), P~ = exp(S_ij - m~) written over S, l~ = rowsum(P~).
template <class Cfg>
__device__ __forceinline__ void fa1_block_softmax(float (&S)[Cfg::kMaxNT][4], int bc,
                                                  float (&m_tilde)[2], float (&l_tilde)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) m_tilde[r] = neg_infinity(), l_tilde[r] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < Cfg::kMaxNT; ++nt) {
        if (8 * nt >= bc) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) m_tilde[e / 2] = nan_max(m_tilde[e / 2], S[nt][e]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        m_tilde[r] = nan_max(m_tilde[r], __shfl_xor_sync(0xffffffffu, m_tilde[r], 1));
        m_tilde[r] = nan_max(m_tilde[r], __shfl_xor_sync(0xffffffffu, m_tilde[r], 2));
    }
#pragma unroll
    for (int nt = 0; nt < Cfg::kMaxNT; ++nt) {
        if (8 * nt >= bc) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            S[nt][e] = exp2_of_difference(S[nt][e], m_tilde[e / 2], kLog2e);
            l_tilde[e / 2] += S[nt][e];
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_tilde[r] += __shfl_xor_sync(0xffffffffu, l_tilde[r], 1);
        l_tilde[r] += __shfl_xor_sync(0xffffffffu, l_tilde[r], 2);
    }
}

// O_i's old value pair of this lane at (row, col), col even: 0 past the slice's rows and past d.
__device__ __forceinline__ float2 fa1_read_o_pair(const float* O_slice, int row, int col,
                                                  int rows, int d, bool whole) {
    float2 v = make_float2(0.0f, 0.0f);
    if (row >= rows) return v;
    const float* src = O_slice + std::int64_t(row) * d + col;
    if (whole) return *reinterpret_cast<const float2*>(src);  // 8-byte aligned: d even
    if (col < d) v.x = src[0];
    if (col + 1 < d) v.y = src[1];
    return v;
}

// Line 12: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j), read
// from and written to HBM, kDN x 8 columns per pass. P~ tile nt is the A fragment (c0, c2, c1,
// c3) under cuda/ptx/tf32_mma.cuh's key renumbering; V_j rows 8 nt + 2t and 8 nt + 2t + 1 give b0,
// b1.
template <class Cfg>
__device__ __forceinline__ void fa1_tf32_update_output(const float (&P)[Cfg::kMaxNT][4],
                                                       const float* sV, int bc,
                                                       const SoftmaxMerge (&merged)[2],
                                                       const float (&l_old)[2], float* O_slice,
                                                       int rows, int d, int lane) {
    constexpr int kDN = Cfg::kDN;
    const int g = lane / 4, t = lane % 4;
    const bool whole = d == Cfg::D;  // no padded columns: 8-byte loads and stores
#pragma unroll 1
    for (int dn0 = 0; dn0 < Cfg::D / 8; dn0 += kDN) {
        // Alg1 L8's O_i for this pass: into registers now (kReadOFirst), or asked into L2 now
        // and read after the products (see Fa1Tf32Tile).
        float2 o_old[kDN][2];
        if constexpr (Cfg::kReadOFirst) {
#pragma unroll
            for (int n = 0; n < kDN; ++n)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    o_old[n][r] =
                        fa1_read_o_pair(O_slice, g + 8 * r, 8 * (dn0 + n) + 2 * t, rows, d, whole);
        } else {
            constexpr int kLinesPerRow = kDN * 8 * 4 / 128;  // 128-byte lines per row and pass
            for (int k = lane; k < 16 * kLinesPerRow; k += 32) {
                const int row = k / kLinesPerRow, col = 8 * dn0 + 32 * (k % kLinesPerRow);
                if (row < rows && col < d) prefetch_l2(O_slice + std::int64_t(row) * d + col);
            }
        }
        float pv[kDN][4] = {};
        const float* v_lane = sV + 2 * t * Cfg::kVStride + 8 * dn0 + g;  // key 2t, column 8 dn0 + g
#pragma unroll
        for (int nt = 0; nt < Cfg::kMaxNT; ++nt) {
            if (8 * nt >= bc) break;
            const tf32::Split a[4] = {tf32::split(P[nt][0]), tf32::split(P[nt][2]),
                                      tf32::split(P[nt][1]), tf32::split(P[nt][3])};
            const float* v0 = v_lane + 8 * nt * Cfg::kVStride;  // key 8 nt + 2t
            const float* v1 = v0 + Cfg::kVStride;              // key 8 nt + 2t + 1
            tf32::Split bv[kDN][2];
#pragma unroll
            for (int n = 0; n < kDN; ++n)
                bv[n][0] = tf32::split(v0[8 * n]), bv[n][1] = tf32::split(v1[8 * n]);
            float part[kDN][4] = {};
            tf32::mma_3xtf32<kDN>(part, a, bv);
#pragma unroll
            for (int n = 0; n < kDN; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) pv[n][e] += part[n][e];
        }
#pragma unroll
        for (int n = 0; n < kDN; ++n)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = g + 8 * r, col = 8 * (dn0 + n) + 2 * t;
                if (row >= rows) continue;
                if constexpr (!Cfg::kReadOFirst)
                    o_old[n][r] = fa1_read_o_pair(O_slice, row, col, rows, d, whole);
                const float2 v = {
                    fa1_output_update(o_old[n][r].x, l_old[r], pv[n][2 * r], merged[r]),
                    fa1_output_update(o_old[n][r].y, l_old[r], pv[n][2 * r + 1], merged[r])};
                float* dst = O_slice + std::int64_t(row) * d + col;
                if (whole) {
                    *reinterpret_cast<float2*>(dst) = v;
                } else {
                    if (col < d) dst[0] = v.x;
                    if (col + 1 < d) dst[1] = v.y;
                }
            }
    }
}

// One thread block: lines 2-13 for the query blocks of one row group of one (batch, head).
// Grid: batch * heads * row_groups blocks; dynamic shared memory Cfg::smem_bytes(Bc).
template <class Cfg, bool kBlockMask>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fa1_tf32_kernel(const Fa1Tf32Params params) {
    extern __shared__ float4 smem_float4[];
    const AttentionProblem& p = params.problem;
    const int Br = params.Br, Bc = params.Bc;
    float* const sK = reinterpret_cast<float*>(smem_float4);
    float* const sV = sK + Cfg::padded_keys(Bc) * Cfg::kQKStride;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    float* const sQ_w = sV + Cfg::padded_keys(Bc) * Cfg::kVStride + warp * 16 * Cfg::kQKStride;

    const std::int64_t Tr = tile_count(p.seq_q, Br), Tc = tile_count(p.seq_kv, Bc);
    const std::int64_t bh = blockIdx.x / params.row_groups, group = blockIdx.x % params.row_groups;
    const std::int64_t b = bh / p.heads, h = bh % p.heads;
    const std::int64_t per_group = ceil_div(Tr, std::int64_t{params.row_groups});
    const std::int64_t i_begin = group * per_group, i_end = min(Tr, i_begin + per_group);
    if (i_begin >= i_end) return;
    const int d = int(p.dim);
    const float* Q = params.Q + p.q_offset(b, h);
    const float* K = params.K + p.kv_offset(b, h);
    const float* V = params.V + p.kv_offset(b, h);
    float* O = static_cast<float*>(params.O) + p.q_offset(b, h);  // always contiguous float32 here
    float* l_hbm = params.l + p.lse_offset(b, h);
    float* m_hbm = params.m + p.lse_offset(b, h);
    const TileRange my_rows = {i_begin * Br, min(i_end * Br, p.seq_q)};
    const int slices = int(ceil_div(my_rows.size(), std::int64_t{16}));
    const float scale = p.softmax_scale();
    const int g = lane / 4;

    // Alg1 L2: O = 0, l = 0, m = -inf (this block's rows); the first step's barrier publishes it.
    for (std::int64_t e = threadIdx.x; e < my_rows.size() * d; e += Cfg::kThreads)
        O[my_rows.begin * d + e] = 0.0f;
    for (std::int64_t r = my_rows.begin + threadIdx.x; r < my_rows.end; r += Cfg::kThreads) {
        l_hbm[r] = 0.0f;
        m_hbm[r] = neg_infinity();
    }

    for (std::int64_t j = 0; j < Tc; ++j) {  // Alg1 L5
        const TileRange cols = tile_range(j, Bc, p.seq_kv);
        if (mma::visibility<kBlockMask>(p, my_rows, cols) == TileVisibility::none) continue;
        const int bc = int(cols.size()), col0 = int(cols.begin), col_end = int(cols.end);

        // Alg1 L6: K_j, V_j to shared memory (rows bc..padded_keys(bc)-1 zero-filled).
        __syncthreads();  // every warp is done with the previous K_j, V_j; line 2 is visible
        load_tile_async(sK, Cfg::kQKStride, K + cols.begin * d, d, Cfg::padded_keys(bc), Cfg::D,
                        bc, d, int(threadIdx.x), Cfg::kThreads);
        load_tile_async(sV, Cfg::kVStride, V + cols.begin * d, d, Cfg::padded_keys(bc), Cfg::D,
                        bc, d, int(threadIdx.x), Cfg::kThreads);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();

        for (int slice = warp; slice < slices; slice += Cfg::kWarps) {  // Alg1 L7
            const int row0 = int(my_rows.begin) + 16 * slice;
            const int rows = min(16, int(my_rows.end) - row0);
            const TileVisibility seen =
                mma::visibility<kBlockMask>(p, TileRange{row0, row0 + rows}, cols);
            if (seen == TileVisibility::none) continue;  // m, l, O of these rows stay as they are

            // Alg1 L8: Q_i's rows (zero past d and past the slice), l_i, m_i of rows g, g + 8.
            load_tile_async(sQ_w, Cfg::kQKStride, Q + std::int64_t(row0) * d, d, 16, Cfg::D, rows,
                            d, lane, 32);
            cp_async_commit();
            float m_old[2], l_old[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = min(g + 8 * r, rows - 1);  // rows past the slice: discarded
                m_old[r] = m_hbm[row0 + row];
                l_old[r] = l_hbm[row0 + row];
            }
            cp_async_wait_all();
            __syncwarp();

            float S[Cfg::kMaxNT][4];
            fa1_tf32_scores<Cfg>(S, sQ_w, sK, bc, lane);  // Alg1 L9
            fa1_scale_and_mask<Cfg, kBlockMask>(S, p, scale,
                                                seen == TileVisibility::partial || bc % 32 != 0,
                                                row0, col0, col_end, bc, lane);
            float m_tilde[2], l_tilde[2];
            fa1_block_softmax<Cfg>(S, bc, m_tilde, l_tilde);  // Alg1 L10
            SoftmaxMerge merged[2];
#pragma unroll
            for (int r = 0; r < 2; ++r)  // Alg1 L11
                merged[r] = merge_softmax({m_old[r], l_old[r]}, {m_tilde[r], l_tilde[r]});
            fa1_tf32_update_output<Cfg>(S, sV, bc, merged, l_old,  // Alg1 L12
                                        O + std::int64_t(row0) * d, rows, d, lane);
            if (lane % 4 == 0)  // Alg1 L13
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    if (g + 8 * r < rows) {
                        l_hbm[row0 + g + 8 * r] = merged[r].l_new;
                        m_hbm[row0 + g + 8 * r] = merged[r].m_new;
                    }
            __syncwarp();  // the slice's Q rows are read; the next slice may overwrite them
        }
    }
    // Alg1 L16 returns O; the LSE of each row is m + log(l).
    __syncthreads();
    float* lse = params.lse + p.lse_offset(b, h);
    for (std::int64_t r = my_rows.begin + threadIdx.x; r < my_rows.end; r += Cfg::kThreads)
        lse[r] = log_sum_exp({m_hbm[r], l_hbm[r]});
}

}  // namespace flashattn::cuda
