// cuda/stages/mma_stages.cuh — the warp-level stages every tensor-core flash kernel shares: masking
// a tile of scores, the online softmax of FlashAttention-2's Algorithm 1 lines 9-10 on registers,
// and the epilogue (lines 12-15: O_i / l_i, L_i = m_i + log l_i, one write each).
//
// Used by cuda-tc (fp16/bf16, cuda/tc/kernel.cuh), cuda-fa2's 3xTF32 kernel
// (cuda/fa2/kernel_tf32.cuh) and cuda-fa1's (cuda/fa1/kernel_tf32.cuh). What they share is the
// accumulator layout of the mma.sync instructions, not the input type: an m16n8 C fragment (fp32)
// gives lane (g, t) = (lane / 4, lane % 4) rows g and g + 8, columns 2t and 2t + 1 of every
// 8-column block, for m16n8k16 (16-bit inputs) and m16n8k8 (tf32) alike (cuda/ptx/mma_sync.cuh
// draws it). So a row's values are spread over the 4 lanes of a quad, and a row reduction is two
// shuffles.
//
// `Cfg` is a kernel's compile-time tile shape; these stages read Cfg::Bc (keys per tile), Cfg::D
// (padded head dim) and Cfg::kMTiles (16-row tiles per warp). The rule itself (nan_max,
// exp2_shift, exp2_shifted, exp2_of_difference) is common/online_softmax.hpp's.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/array_layout.hpp"
#include "common/dtype.hpp"
#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/ptx/mma_sync.cuh"
#include "cuda/stages/output_store.cuh"

namespace flashattn::mma {

// Everything the kernel reads; passed by value (it lives in the constant bank).
struct KernelParams {
    const void* Q;  // (batch, heads,    seq_q,  dim) of T
    const void* K;  // (batch, heads_kv, seq_kv, dim) of T
    const void* V;  // (batch, heads_kv, seq_kv, dim) of T
    void* O;        // (batch, heads, seq_q, dim) at o_layout, of o_dtype
    float* lse;     // (batch, heads, seq_q)
    AttentionProblem problem;  // its block_mask.data (if any) points to device memory
    float scale_log2;          // c = |scale| log2(e) > 0 (a negative scale is folded into Q)
    float lse_scale;           // |scale|: LSE = m |scale| + log(l) for raw-score maxima m
    // Split-KV (decoding): with kv_splits = S > 1 the grid's x holds S chunks of the key tiles
    // (split_chunk, common/tiling.hpp) per query tile, and chunk s writes its partial result --
    // O_s normalized over its own keys, and LSE_s -- at O_partial + s q_elements and lse_partial
    // + s lse_elements instead of O and lse; cuda/stages/combine.cuh merges them.
    int kv_splits = 1;
    float* O_partial = nullptr;
    float* lse_partial = nullptr;
    // Where O's rows lie and what they hold: contiguous float32 (make_params) unless a device
    // entry that takes a caller's layout says otherwise (cuda-fa3, cuda-fa2; DeviceForward).
    // Split-KV's partials are always contiguous float32.
    ArrayLayout o_layout = {};
    DType o_dtype = DType::f32;
    // Where Q's, K's and V's rows lie (resolved): contiguous (make_params) unless a device entry
    // that reads its caller's views in place says otherwise (cuda-fa2's, with cp.async).
    QkvLayouts in = {};
};

// The parameters of one launch. The kernels need c = |scale| log2(e) > 0 (see exp2_shifted).
// Scale 0 means every visible key gets weight 1: any c small enough that |s| c rounds 2^(s c) to
// exactly 1 does that.
inline KernelParams make_params(const AttentionProblem& p, const void* Q, const void* K,
                                const void* V, void* O, float* lse) {
    const float scale = std::fabs(p.softmax_scale());
    KernelParams params{Q, K, V, O, lse, p, scale > 0 ? scale * kLog2e : 1e-30f, scale};
    params.o_layout = ArrayLayout::contiguous(p.heads, p.seq_q, p.dim);
    params.in = QkvLayouts::contiguous(p);
    return params;
}

// Scores a query row may not see become -inf: keys at or past N_kv (the ragged last tile, whose
// K rows were zero-filled) and keys hidden by the causal or the block mask. Called only for tiles
// that classify_tile calls partial, and for the ragged last tile. row0: the row tile's first row.
// Without a block mask the visible keys of a row are a prefix (causal_visible), so each row needs
// one bound; with one, every score asks AttentionProblem::key_visible.
template <class Cfg, bool kBlockMask>
__device__ __forceinline__ void mask_scores(float (&S)[Cfg::Bc / 8][4], const AttentionProblem& p,
                                            int row0, int col0, int lane) {
    if constexpr (!kBlockMask) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + lane / 4 + 8 * r;
            const std::int64_t last_key = p.last_causal_key(row, p.seq_kv);
            // Entry (nt, 2 r + e) is key col0 + 8 nt + 2 (lane % 4) + e; clamping the bound to
            // [-1, Bc] lets the per-entry test be a 32-bit compare.
            const std::int64_t last64 = last_key - col0 - 2 * (lane % 4);
            const int last = int(last64 < -1 ? -1 : (last64 > Cfg::Bc ? Cfg::Bc : last64));
#pragma unroll
            for (int nt = 0; nt < Cfg::Bc / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (8 * nt + e > last) S[nt][2 * r + e] = -INFINITY;
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < Cfg::Bc / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + lane / 4 + 8 * (e / 2);
                const int col = col0 + 8 * nt + 2 * (lane % 4) + e % 2;
                // Rows past N_q (padding of the last query tile, never stored) must not index
                // the block mask: its row of blocks does not exist.
                if (row >= p.seq_q || col >= p.seq_kv || !p.key_visible(row, col))
                    S[nt][e] = -INFINITY;
            }
    }
}

// part[r][0] = op over part[r][0 .. kCount), as a tree: about log2 steps instead of a chain. Each
// step folds the upper half onto the lower (for an odd count the middle entry waits a step), so
// for a power of two it is the halving tree. Written as a compile-time recursion because a loop
// whose inner trip count halves each step is not fully unrolled by nvcc at 16 columns and put
// `part` in local memory (measured: 128-byte stack frame at Bc = 128).
template <int kCount, int kN, class Op>
__device__ __forceinline__ void pairwise_reduce(float (&part)[2][kN], Op op) {
    if constexpr (kCount > 1) {
        constexpr int kLower = kCount - kCount / 2;  // entries kept: [0, kLower)
#pragma unroll
        for (int nt = 0; nt < kCount / 2; ++nt)
#pragma unroll
            for (int r = 0; r < 2; ++r) part[r][nt] = op(part[r][nt], part[r][nt + kLower]);
        pairwise_reduce<kLower>(part, op);
    }
}

// FA2 L9 and the rescale half of L10, for one row tile; the lane holds rows g and g + 8 (index
// r = e / 2 of accumulator entry e):
//   m_new = max(m_i, rowmax(S))             nan_max over the lane's entries, then over the quad
//   P~    = exp(scale (S - m_new))          exp2_shifted, written over S in place
//   l_i   = exp(scale (m_i - m_new)) l_i + rowsum(P~)    (the lane's partial row sum)
//   O_i  *= exp(scale (m_i - m_new))        rescale_output, with the factor softmax_update returns
// The rule itself (nan_max, exp2_shift, exp2_shifted) is common/online_softmax.hpp's.
// kExactDifference: exponents as (s - m) c (exp2_of_difference) instead of s c - m c, for the fp32
// kernel (cuda/fa2/kernel_tf32.cuh), which is held to fp32 accuracy at large logits too.
// kLazyRescale: m_i is a reference maximum kept while the block's maximum exceeds it by at most
// kLazyRescaleLog2 (keeps_reference_max, common/online_softmax.hpp); a kept row's factor is
// exactly 1, and rescale_output skips a warp whose rows all kept theirs (cuda-fa3 at d = 256,
// cuda-tc's forward at d >= 128).
//
// softmax_update does all but the last line and returns exp(scale (m_i - m_new)) per row in
// old_scale; a kernel whose O_i is still being accumulated by an asynchronous P V (cuda-fa3's
// overlapped loop) calls rescale_output once that product has landed. online_softmax is both.
template <class Cfg, bool kExactDifference = false, bool kLazyRescale = false>
__device__ __forceinline__ void softmax_update(float (&S)[Cfg::Bc / 8][4], float (&m)[2],
                                               float (&l)[2], float scale_log2,
                                               float (&old_scale)[2]) {
    // The lane's maximum of each row, as a pairwise tree: about log2(Bc / 8) dependent steps
    // instead of a chain of Bc / 8 (each step waits for the previous result).
    constexpr int kNT = Cfg::Bc / 8;
    float part[2][kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) part[r][nt] = nan_max(S[nt][2 * r], S[nt][2 * r + 1]);
    pairwise_reduce<kNT>(part, [](float a, float b) { return nan_max(a, b); });
    float m_new[2] = {nan_max(m[0], part[0][0]), nan_max(m[1], part[1][0])};
    // The 4 lanes of a quad hold the same two rows: combine their maxima.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        m_new[r] = nan_max(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 1));
        m_new[r] = nan_max(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 2));
    }
    float shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        // Under kLazyRescale a row whose reference stays keeps it: P~ below is taken against it
        // and the factor is 1, not e^(c (m - m)) rounded.
        const bool kept = kLazyRescale && keeps_reference_max(m[r], m_new[r], scale_log2);
        if (kept) m_new[r] = m[r];
        shift[r] = exp2_shift(m_new[r], scale_log2);
        old_scale[r] = kept ? 1.0f
                       : kExactDifference  // 0 while m_i = -inf
                           ? exp2_of_difference(m[r], m_new[r], scale_log2)
                           : exp2_shifted(m[r], shift[r], scale_log2);
        m[r] = m_new[r];
        l[r] *= old_scale[r];
    }
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            S[nt][e] = kExactDifference ? exp2_of_difference(S[nt][e], m_new[e / 2], scale_log2)
                                        : exp2_shifted(S[nt][e], shift[e / 2], scale_log2);
    // rowsum(P~), the same pairwise tree.
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) part[r][nt] = S[nt][2 * r] + S[nt][2 * r + 1];
    pairwise_reduce<kNT>(part, [](float a, float b) { return a + b; });
    l[0] += part[0][0];
    l[1] += part[1][0];
}

// O_i *= the factors of softmax_update. Under kLazyRescale a warp whose rows all kept their
// reference maximum (every factor exactly 1) skips the multiplications: the vote is the warp's, so
// that the branch is taken or not by all its lanes.
template <class Cfg, bool kLazyRescale = false>
__device__ __forceinline__ void rescale_output(float (&O)[Cfg::D / 8][4], const float (&old_scale)[2]) {
    if constexpr (kLazyRescale)
        if (!__any_sync(0xffffffffu, old_scale[0] != 1.0f || old_scale[1] != 1.0f)) return;
#pragma unroll
    for (int dt = 0; dt < Cfg::D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[dt][e] *= old_scale[e / 2];
}

template <class Cfg, bool kExactDifference = false, bool kLazyRescale = false>
__device__ __forceinline__ void online_softmax(float (&S)[Cfg::Bc / 8][4], float (&m)[2],
                                               float (&l)[2], float (&O)[Cfg::D / 8][4],
                                               float scale_log2) {
    float old_scale[2];
    softmax_update<Cfg, kExactDifference, kLazyRescale>(S, m, l, scale_log2, old_scale);
    rescale_output<Cfg, kLazyRescale>(O, old_scale);
}

// Whether row `row` sees any key (AttentionProblem::row_has_visible_key), out of line on purpose:
// the epilogue asks it only for a row whose sum came out 0, and inlined into each of its rows the
// block-mask walk (kernels with a block mask) costs registers that the d = 64 tiles, at the 255 limit, do not have (they
// spill). The problem is passed by value: copied only on that rare path.
__device__ __noinline__ inline bool row_has_visible_key_rare(const AttentionProblem p, int row) {
    return p.row_has_visible_key(row);
}

// FA2 L12-L15 for the lane's two rows of a warp's row tile (first row row0; the lane's rows are
// row0 + lane / 4 + 8 r, r = 0, 1), for the rows that exist: l_i summed over the quad (each lane
// held a partial sum over its own columns), L_i = m_i + log(l_i) written to lse_head[row] (not
// when lse_head is null: another warp writes it), and
// store_row(r, row, scale, overflowed) asked to write the row's values O_i * scale
// (final_output_scaled): O_i = diag(l_i)^-1 O_i with one reciprocal per row (output_scale), NaN
// for a row whose visible scores all overflowed (scores_overflowed, common/online_softmax.hpp).
// Under split-KV (`partial`) a chunk may hold none of a row's visible keys: its partial is then
// the empty one, and the overflow test waits for the merge (cuda/stages/combine.cuh).
template <bool kBlockMask, class StoreRow>
__device__ __forceinline__ void finish_rows(const float (&m)[2], const float (&l)[2],
                                            const KernelParams& params, int row0, float* lse_head,
                                            bool partial, int lane, StoreRow&& store_row) {
    const AttentionProblem& p = params.problem;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l_row = l[r];
        l_row += __shfl_xor_sync(0xffffffffu, l_row, 1);
        l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
        const int row = row0 + lane / 4 + 8 * r;
        // Rows past N_q pad the last query tile; rows below 0 the first one where the tiles are
        // cut from the end (cuda-fa3, query_tile_shift). Neither is stored.
        if (row < 0 || row >= p.seq_q) continue;
        const SoftmaxState state{m[r] * params.lse_scale, l_row};  // m in LSE's units
        const bool overflowed =
            !partial && scores_overflowed(state, [&] {
                return kBlockMask ? row_has_visible_key_rare(p, row) : p.row_has_visible_key(row);
            });
        store_row(r, row, output_scale(l_row), overflowed);  // 1 / l_i, once for the row
        if (lane % 4 == 0 && lse_head != nullptr)
            lse_head[row] = final_lse(state, overflowed);
    }
}

// FA2 L12-L15 for one row tile (first row row0), each lane storing its own values (finish_rows).
// O's rows lie where params.o_layout says, in params.o_dtype; columns p.dim..D-1 (the zero
// padding of a head dim that is not one of the compiled D, as cuda-fa2's tensor-core kernel has)
// are not written. Chunk `split` of a split-KV launch writes its partial result into its own slice
// (contiguous float32). A warp may hold only kTiles of O's n8 column tiles, starting at column
// col0 (cuda/tc/decode_kernel.cuh, whose warps share the columns); then only one of the warps
// that share the rows stores L_i (store_lse).
template <class Cfg, bool kBlockMask, int kTiles = Cfg::D / 8>
__device__ __forceinline__ void write_output(const float (&O)[kTiles][4], const float (&m)[2],
                                             const float (&l)[2], const KernelParams& params,
                                             int row0, std::int64_t b, std::int64_t h, int lane,
                                             int split, int col0 = 0, bool store_lse = true) {
    const AttentionProblem& p = params.problem;
    const bool partial = params.kv_splits > 1;
    void* const O_out = partial ? params.O_partial + split * p.q_elements() : params.O;
    const DType o_dtype = partial ? DType::f32 : params.o_dtype;
    const std::int64_t row_stride = partial ? p.dim : params.o_layout.row;
    const std::int64_t O_head = partial ? p.q_offset(b, h) : params.o_layout.offset(b, h);
    float* lse_head = (partial ? params.lse_partial + split * p.lse_elements() : params.lse) +
                      p.lse_offset(b, h);
    finish_rows<kBlockMask>(m, l, params, row0, store_lse ? lse_head : nullptr, partial, lane,
                            [&](int r, int row, float scale, bool overflowed) {
        const std::int64_t O_row =
            O_head + std::int64_t(row) * row_stride + col0 + 2 * (lane % 4);
        if (p.dim == Cfg::D) {
#pragma unroll
            for (int dt = 0; dt < kTiles; ++dt)
                store_output_pair(O_out, o_dtype, O_row + 8 * dt,
                                  final_output_scaled(O[dt][2 * r], scale, overflowed),
                                  final_output_scaled(O[dt][2 * r + 1], scale, overflowed));
        } else {  // padded d (possibly odd: no paired stores)
#pragma unroll
            for (int dt = 0; dt < kTiles; ++dt)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (col0 + 8 * dt + 2 * (lane % 4) + e < p.dim)
                        store_output(O_out, o_dtype, O_row + 8 * dt + e,
                                     final_output_scaled(O[dt][2 * r + e], scale, overflowed));
        }
    });
}

// The online-softmax state of one row tile as one object: the lane's m_i and (partial) l_i for its
// rows g and g + 8, initialized as FA2 L5 says (m = -inf, l = 0), with the three things a kernel
// does with them. The rule itself stays in common/online_softmax.hpp (through softmax_update).
//   update     FA2 L9 and L10's rescale: S becomes P~, O_i is rescaled (online_softmax);
//   update_only  FA2 L9 alone, returning the rescale factors for a kernel whose O_i is still being
//              accumulated by an asynchronous P V (cuda-fa3), which calls rescale(O, factors)
//              once that product has landed;
//   finalize   FA2 L12-L15: O_i / l_i and L_i written (write_output), or chunk `split`'s partial
//              result under split-KV.
// kLazyRescale: m_i is a reference maximum, moved only when a block exceeds it by more than
// kLazyRescaleLog2 (softmax_update); L_i = m_i + log(l_i) holds for any reference.
template <class Cfg, bool kExactDifference = false, bool kLazyRescale = false>
struct RowSoftmax {
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};

    __device__ __forceinline__ void update(float (&S)[Cfg::Bc / 8][4], float (&O)[Cfg::D / 8][4],
                                           float scale_log2) {
        online_softmax<Cfg, kExactDifference, kLazyRescale>(S, m, l, O, scale_log2);
    }
    __device__ __forceinline__ void update_only(float (&S)[Cfg::Bc / 8][4], float scale_log2,
                                                float (&old_scale)[2]) {
        softmax_update<Cfg, kExactDifference, kLazyRescale>(S, m, l, scale_log2, old_scale);
    }
    __device__ __forceinline__ static void rescale(float (&O)[Cfg::D / 8][4],
                                                   const float (&old_scale)[2]) {
        rescale_output<Cfg, kLazyRescale>(O, old_scale);
    }
    template <bool kBlockMask>
    __device__ __forceinline__ void finalize(const float (&O)[Cfg::D / 8][4],
                                             const KernelParams& params, int row0, std::int64_t b,
                                             std::int64_t h, int lane, int split = 0) const {
        write_output<Cfg, kBlockMask>(O, m, l, params, row0, b, h, lane, split);
    }
};

// How much of key tile [cols) the query rows [rows) may see. Without a block mask this is
// classify_causal; with one, classify_tile also walks the mask blocks the tile overlaps (64-bit
// divisions, which a GPU runs as subroutine calls: kept out of kernels that have no block mask).
template <bool kBlockMask>
__device__ __forceinline__ TileVisibility visibility(const AttentionProblem& p, TileRange rows,
                                                     TileRange cols) {
    if constexpr (kBlockMask)
        return classify_tile(p, rows, cols);
    else
        return classify_causal(p, rows, cols);
}

// The next key tile at or after j that the CTA's query rows can see (Tc_seen if none): with a
// block mask, invisible tiles are neither loaded nor multiplied; without one, every tile before
// Tc_seen (the causal diagonal) is visible.
template <bool kBlockMask>
__device__ __forceinline__ int next_key_tile(const AttentionProblem& p, TileRange rows, int j,
                                             int Tc_seen, int Bc) {
    if constexpr (kBlockMask)
        return int(next_visible_tile(p, TileAxis::keys, rows, j, Tc_seen, Bc));
    return j;
}

}  // namespace flashattn::mma
