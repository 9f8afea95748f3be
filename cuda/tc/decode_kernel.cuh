// cuda/tc/decode_kernel.cuh — cuda-tc's decoding kernel: a few query rows against a long K/V cache,
// where the warps of a CTA split the keys instead of the query rows. docs/decoding.md teaches it.
//
// Why another loop. FlashAttention-2's forward (cuda/stages/flash_forward.cuh) gives each warp
// its own query rows and walks all keys with every warp. At decoding shapes a head has 1 to 16
// query rows (a GQA group packed into one head, common/gqa_packing.hpp): a 128-row tile would
// compute 128 rows of scores to use a few, and the tensor cores, not HBM, would set the pace
// (Q K^T and P V of 128 rows take about as long as reading the K/V tile they use). Decoding is
// bound by reading K and V once (docs/decoding.md), so the work per byte must stay small:
//
//   * one m16 row tile per CTA (16 query rows: the smallest mma.sync tile), shared by all warps;
//   * each K_j / V_j tile of Bc = kWarps kWarpKeys keys is cut into kWarps slices, and warp w
//     runs Algorithm 1's lines 8-10 on its slice only: S = Q_i K_w^T, its own online softmax
//     (m_w, l_w) and O_w += P~ V_w. The warps' states are partial results over disjoint keys;
//   * after the last tile the warps' partial results are merged in shared memory -- the
//     online-softmax update (common/online_softmax.hpp) applied to whole blocks, as split-KV's
//     combine merges chunks across CTAs -- each warp merging and writing its own columns of O_i
//     (write_output); warp 0 writes L_i.
//
// Everything else is the prefill kernel's: the tile stages of cuda/tc/kernel.cuh (swizzled
// cp.async copies, ldmatrix, m16n8k16 products), the masks and the softmax of
// cuda/stages/mma_stages.cuh, the key chunks of split-KV (KernelParams::kv_splits) and the
// skipping of tiles a mask hides. The merge order of the warps is fixed: the result is the same
// on every run.
#pragma once

#include <cstdint>

#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/dependent_launch.cuh"
#include "cuda/stages/mma_stages.cuh"
#include "cuda/tc/kernel.cuh"

namespace flashattn::tc {

// Query rows per decoding CTA: one m16 row tile (tc_decodes sends problems of at most this many
// rows per head, GQA groups packed, to this kernel).
constexpr int kDecodeRows = 16;

// The compile-time shape of a decoding CTA: kDecodeRows query rows, kWarps warps, key tiles of
// Bc = kWarps kWarpKeys rows in a ring of kStages buffers. Two views of it as a TcTile, so that
// cuda/tc/kernel.cuh's stages serve unchanged:
//   Cta   the copies: all kThreads threads move whole tiles (Q_i of 16 rows, K_j and V_j of Bc);
//   Warp  the products and the softmax: one warp, one row tile, kWarpKeys keys.
template <class T_, int D_, int kWarps_, int kWarpKeys_, int kStages_>
struct DecodeTile {
    using T = T_;
    using Cta = TcTile<T_, D_, kWarps_, 1, kWarps_ * kWarpKeys_, kStages_>;
    using Warp = TcTile<T_, D_, 1, 1, kWarpKeys_, kStages_>;
    static constexpr int D = D_, kWarps = kWarps_, kWarpKeys = kWarpKeys_, kStages = kStages_;
    static constexpr int Br = kDecodeRows, Bc = kWarps_ * kWarpKeys_, kThreads = 32 * kWarps_;
    // What a lane hands to the merge: its O_w fragments (D / 2 values), m_w and l_w of rows g, g + 8.
    static constexpr int kMergeValues = D_ / 2 + 4;
    // O's n8 column tiles that each warp merges and writes (merge_warps).
    static constexpr int kSliceTiles = D_ / 8 / kWarps_;
    static constexpr int kRingBytes = 2 * kStages_ * Bc * D_ * int(sizeof(T_));
    static constexpr int kMergeBytes = kWarps_ * 32 * kMergeValues * int(sizeof(float));
    // Q_i, then the ring of K_j and V_j tiles; the merge reuses the ring once the loop is done.
    static constexpr int kSmemBytes =
        Br * D_ * int(sizeof(T_)) + (kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes);

    static_assert(kWarpKeys_ % 16 == 0, "a warp's slice is whole k = 16 steps of P V");
    static_assert(D_ / 8 % kWarps_ == 0, "the warps share O's column tiles evenly in the merge");
};

// Merges the kWarps partial results (O_w, m_w, l_w) of one row tile, each over its warp's key
// slices: m = max_w m_w, and with f_w = e^(scale (m_w - m)), O = sum_w f_w O_w and
// l = sum_w f_w l_w (FlashAttention's Algorithm 1 lines 11-12 with whole blocks; exp2_shift and
// exp2_shifted are the rule of common/online_softmax.hpp, so a warp that saw no key (m_w = -inf)
// weighs 0 and a NaN anywhere makes the row NaN). The warps share the columns: warp w merges
// O's columns [w D / kWarps, (w + 1) D / kWarps) into O_slice, a quarter of the columns' work
// where one warp did it all (docs/decoding.md, "The warps' merge shared by columns"), and every
// warp computes the same m and l (the lane's partial sums, as write_output takes them). `merge` is shared memory of Tile::kMergeBytes, laid out
// [warp][value][lane] so that every access is conflict-free. The warps are summed in a fixed
// order: the same bits on every run. Called by all threads.
template <class Tile>
__device__ __forceinline__ void merge_warps(const float (&O)[Tile::D / 8][4], float (&m)[2],
                                            float (&l)[2],
                                            float (&O_slice)[Tile::kSliceTiles][4],
                                            float* merge, float scale_log2, int warp, int lane) {
    constexpr int kO = Tile::D / 2;  // O's values per lane
    float* mine = merge + warp * 32 * Tile::kMergeValues + lane;
#pragma unroll
    for (int dt = 0; dt < Tile::D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(4 * dt + e) * 32] = O[dt][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) mine[(kO + r) * 32] = m[r], mine[(kO + 2 + r) * 32] = l[r];
    __syncthreads();
    auto value = [&](int w, int v) { return merge[(w * Tile::kMergeValues + v) * 32 + lane]; };
    float m_new[2] = {value(0, kO), value(0, kO + 1)};
#pragma unroll
    for (int w = 1; w < Tile::kWarps; ++w)
#pragma unroll
        for (int r = 0; r < 2; ++r) m_new[r] = nan_max(m_new[r], value(w, kO + r));
    float shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        shift[r] = exp2_shift(m_new[r], scale_log2);
        m[r] = m_new[r];
        l[r] = 0.0f;
    }
#pragma unroll
    for (int t = 0; t < Tile::kSliceTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) O_slice[t][e] = 0.0f;
    const int first_value = 4 * Tile::kSliceTiles * warp;  // this warp's columns in O's values
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) {
        float f[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            f[r] = exp2_shifted(value(w, kO + r), shift[r], scale_log2);
            l[r] += f[r] * value(w, kO + 2 + r);
        }
#pragma unroll
        for (int t = 0; t < Tile::kSliceTiles; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                O_slice[t][e] += f[e / 2] * value(w, first_value + 4 * t + e);
    }
}

// Grid: (Tr kv_splits, heads, batch) with Tr the 16-row query tiles; block: Tile::kThreads;
// dynamic shared memory: Tile::kSmemBytes. kBlockMask, kSplitKV: as tc_forward_kernel's. Both
// ends of a decoding step overlap their neighbours (cuda/ptx/dependent_launch.cuh): the kernel
// starts while the stream's previous kernel ends, and a split launch lets its combine start at
// once. At a short cache a step is short enough for a launch's latency to show (docs/decoding.md).
template <class Tile, bool kBlockMask, bool kSplitKV>
__global__ void __launch_bounds__(Tile::kThreads) tc_decode_kernel(const KernelParams params) {
    using Cta = typename Tile::Cta;
    using Warp = typename Tile::Warp;
    using T = typename Tile::T;
    constexpr int D = Tile::D, Bc = Tile::Bc, kStages = Tile::kStages, kWarpKeys = Tile::kWarpKeys;
    extern __shared__ uint4 smem[];  // 16-byte aligned, as cp.async and ldmatrix need
    T* const sQ = reinterpret_cast<T*>(smem);
    T* const sK = sQ + Tile::Br * D;
    T* const sV = sK + kStages * Bc * D;
    const AttentionProblem& p = params.problem;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int seq_q = int(p.seq_q), seq_kv = int(p.seq_kv);
    if constexpr (kSplitKV) cuda::allow_dependent_launch();

    // FA2 L3: query tile i of head h of batch b; under split-KV, key chunk `split` of it.
    const int Tr = kSplitKV ? int(gridDim.x) / params.kv_splits : int(gridDim.x);
    const int split = kSplitKV ? int(blockIdx.x) / Tr : 0;
    const int i = kSplitKV ? int(blockIdx.x) % Tr : int(blockIdx.x);
    const std::int64_t h = blockIdx.y, b = blockIdx.z;
    const int row_begin = i * Tile::Br;
    const TileRange rows = {row_begin, min(row_begin + Tile::Br, seq_q)};
    const T* Q_head = static_cast<const T*>(params.Q) + params.in.q.offset(b, h);
    const T* K_head = static_cast<const T*>(params.K) + params.in.k.offset(b, p.kv_head(h));  // GQA
    const T* V_head = static_cast<const T*>(params.V) + params.in.v.offset(b, p.kv_head(h));
    const int Tc_seen = int(causal_key_tiles(p, rows, Bc).seen);
    const TileRange chunk =
        kSplitKV ? split_chunk(Tc_seen, params.kv_splits, split) : TileRange{0, Tc_seen};
    const int j_end = int(chunk.end);

    // Launched to overlap the stream's previous kernel (launch_decode): nothing is read or
    // written before that kernel has finished. The work above, index arithmetic, overlaps it.
    cuda::wait_for_prerequisite_grid();

    // FA2 L4 and L7 (issued): Q_i, then the first kStages - 1 visible tiles, one group each (a
    // group is committed even when nothing is left to load, as in flash_forward).
    load_tile<Cta, Tile::Br>(sQ, Q_head, row_begin, seq_q);
    cp_async_commit();
    int j_load = mma::next_key_tile<kBlockMask>(p, rows, int(chunk.begin), j_end, Bc);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (j_load < j_end) {
            load_tile<Cta, Bc>(sK + s * Bc * D, K_head, j_load * Bc, seq_kv);
            load_tile<Cta, Bc>(sV + s * Bc * D, V_head, j_load * Bc, seq_kv);
            j_load = mma::next_key_tile<kBlockMask>(p, rows, j_load + 1, j_end, Bc);
        }
        cp_async_commit();
    }
    cp_async_wait<kStages - 1>();
    __syncthreads();
    std::uint32_t q[1][D / 16][4];  // Q_i's A fragments, every warp the same (Warp::kQInRegisters)
    if constexpr (Warp::kQInRegisters) load_q_fragments<Warp>(q, sQ, 0, lane);

    // FA2 L5, for this warp's slices of the keys.
    float O[1][D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[0][dt][e] = 0.0f;
    mma::RowSoftmax<Warp> softmax;

    int stage = 0;
    for (int j = mma::next_key_tile<kBlockMask>(p, rows, int(chunk.begin), j_end, Bc); j < j_end;
         j = mma::next_key_tile<kBlockMask>(p, rows, j + 1, j_end, Bc)) {
        // FA2 L7: tile j has landed and every warp is done with the slot the next copy refills.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (j_load < j_end) {
            const int slot = (stage + kStages - 1) % kStages;
            load_tile<Cta, Bc>(sK + slot * Bc * D, K_head, j_load * Bc, seq_kv);
            load_tile<Cta, Bc>(sV + slot * Bc * D, V_head, j_load * Bc, seq_kv);
            j_load = mma::next_key_tile<kBlockMask>(p, rows, j_load + 1, j_end, Bc);
        }
        cp_async_commit();

        // This warp's slice of tile j: keys [key0, key0 + kWarpKeys), fewer in the ragged last tile.
        const int key0 = j * Bc + warp * kWarpKeys;
        const TileRange cols = {min(key0, seq_kv), min(key0 + kWarpKeys, seq_kv)};
        const TileVisibility seen = cols.size() > 0 ? mma::visibility<kBlockMask>(p, rows, cols)
                                                    : TileVisibility::none;
        if (seen != TileVisibility::none) {
            const int slice = stage * Bc * D + warp * kWarpKeys * D;
            float S[1][kWarpKeys / 8][4];
            compute_scores<Warp>(S, q, sQ, sK + slice, 0, lane);  // FA2 L8
            if (needs_element_mask(seen, cols, kWarpKeys))
                mma::mask_scores<Warp, kBlockMask>(S[0], p, row_begin, key0, lane);
            softmax.update(S[0], O[0], params.scale_log2);  // FA2 L9, L10 (rescale)
            accumulate_pv<Warp>(O, S, sV + slice, lane);    // FA2 L10 (+ P~ V_j)
        }
        stage = (stage + 1) % kStages;
    }

    // The warps' partial results merged, and FA2 L12-L15, each warp for its columns of O (warp 0
    // stores L_i). The ring is free once every copy has landed (some groups were empty) and
    // every warp has left the loop.
    cp_async_wait<0>();
    __syncthreads();
    float O_slice[Tile::kSliceTiles][4];
    merge_warps<Tile>(O[0], softmax.m, softmax.l, O_slice, reinterpret_cast<float*>(sK),
                      params.scale_log2, warp, lane);
    mma::write_output<Warp, kBlockMask, Tile::kSliceTiles>(
        O_slice, softmax.m, softmax.l, params, row_begin, b, h, lane, split,
        /*col0=*/8 * Tile::kSliceTiles * warp, /*store_lse=*/warp == 0);
}

}  // namespace flashattn::tc
