// cuda/stages/flash_forward.cuh — FlashAttention-2's forward on mma.sync tensor cores, written once
// for both precisions: the tile order, the warps' rows, the cp.async ring of K_j / V_j, the masks,
// the online softmax and the epilogue. What differs by precision (how tiles are laid out in shared
// memory, copied and multiplied) is an `Ops` type, as the backward's is
// (cuda/stages/flash_backward.cuh):
//   * cuda-tc (fp16 / bf16 on mma.sync m16n8k16): TcForwardOps, cuda/tc/kernel.cuh;
//   * cuda-fa2 v4 (fp32 as 3xTF32 on mma.sync m16n8k8): Tf32ForwardOps, cuda/fa2/kernel_tf32.cuh.
// Both products leave their results in the same accumulator layout (an m16n8 C fragment: lane
// (g, t) holds rows g and g + 8, columns 2t and 2t + 1 of every 8 columns), so the stages of
// cuda/stages/mma_stages.cuh serve both unchanged.
//
// FlashAttention-2, Algorithm 1 (forward; Dao 2023, arXiv 2307.08691), and where each line lives:
//
//   L3       for 1 <= i <= Tr (one CTA each)       flash_forward: i from blockIdx.x, longest first
//                                                  (split-KV: kv_splits CTAs, a key chunk each)
//   L4       load Q_i                              Ops::load_q, then Ops::hold_q (registers)
//   L5       O_i = 0, l_i = 0, m_i = -inf          O and RowSoftmax, in registers
//   L6       for 1 <= j <= Tc                      the loop (tiles the masks hide are skipped)
//   L7       load K_j, V_j                         Ops::load_kv into the ring, kStages - 1 ahead
//   L8       S_ij = Q_i K_j^T                      Ops::scores (+ mask_scores on partial tiles)
//   L9-L10   m, P~, l, O rescaled, O += P~ V_j     RowSoftmax::update, Ops::accumulate_pv
//   L12-L15  O_i / l_i, L_i = m_i + log l_i        RowSoftmax::finalize
//
// An Ops type provides:
//   using Cfg (Br, Bc, D, kWarps, kMTiles, kWarpRows, kStages, kThreads), using Element (the
//   stored input type), kExactDifference (exponents as (s - m) c: the fp32 kernel's accuracy),
//   kLazyRescale (a reference maximum moved only past keeps_reference_max's bound: RowSoftmax);
//   Ops(params, smem, warp, lane); load_q(Q_head, row_stride, row_begin, n); load_kv(slot,
//   K_head, V_head, layouts (params.in: their row strides), key_begin, n); hold_q() (Q_i has
//   landed); scores(S, slot); accumulate_pv(O, S, slot);
//   inspect_skipped(slot) (a warp whose rows skip tile j) and computed_tile() (CTA-wide, before
//   anything is written: false declines the tile, for the kernel to compute it another way):
//   cuda-fa2's 3xTF32 products and an input they cannot carry; cuda-tc's do nothing.
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/stages/mma_stages.cuh"

namespace flashattn::mma {

// One CTA's whole forward: query tile i of head h of batch b (grid (Tr, heads, batch)), Cfg::kThreads
// threads, the shared memory the Ops lays out. kBlockMask: whether params.problem has a block mask
// (a separate instantiation, so that kernels without one carry none of its code). kSplitKV: whether
// the launch splits the keys (params.kv_splits > 1), also a separate instantiation: the chunk's
// bounds cost registers that the d = 64 tiles, at the 255 limit, do not have to spare (they spill,
// ~8% slower). The host checks that seq_q and seq_kv fit in int; element offsets are 64-bit.
// Returns whether the tile was computed and written (Ops::computed_tile, above).
template <class Ops, bool kBlockMask, bool kSplitKV = false>
__device__ __forceinline__ bool flash_forward(const KernelParams& params, void* smem) {
    using Cfg = typename Ops::Cfg;
    using Element = typename Ops::Element;
    constexpr int Bc = Cfg::Bc, kStages = Cfg::kStages, kM = Cfg::kMTiles;
    const AttentionProblem& p = params.problem;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int seq_q = int(p.seq_q), seq_kv = int(p.seq_kv);
    Ops ops(params, smem, warp, lane);

    // FA2 L3: this CTA is iteration i of the outer loop, for head h of batch b. Under split-KV
    // the grid's x holds kv_splits chunks of the key tiles per query tile (KernelParams).
    const int Tr = kSplitKV ? int(gridDim.x) / params.kv_splits : int(gridDim.x);
    const int split = kSplitKV ? int(blockIdx.x) / Tr : 0;
    const int i = int(longest_first(p.causal, kSplitKV ? blockIdx.x % Tr : blockIdx.x, Tr));
    const std::int64_t h = blockIdx.y, b = blockIdx.z;
    const int row_begin = i * Cfg::Br, row_end = min(row_begin + Cfg::Br, seq_q);
    const TileRange rows = {row_begin, row_end};
    const int warp_begin = min(row_begin + warp * Cfg::kWarpRows, row_end);
    const TileRange warp_rows = {warp_begin, min(warp_begin + Cfg::kWarpRows, row_end)};
    // Each head's rows, params.in's row strides apart (d apart when contiguous).
    const Element* Q_head = static_cast<const Element*>(params.Q) + params.in.q.offset(b, h);
    const Element* K_head =
        static_cast<const Element*>(params.K) + params.in.k.offset(b, p.kv_head(h));  // GQA
    const Element* V_head =
        static_cast<const Element*>(params.V) + params.in.v.offset(b, p.kv_head(h));
    // FA2 L6's range: causal masking hides every key tile past the last row's diagonal.
    const int Tc_seen = int(causal_key_tiles(p, rows, Bc).seen);
    // Split-KV: this CTA's chunk [j_first, j_end) of those tiles (all of them without a split).
    const TileRange chunk =
        kSplitKV ? split_chunk(Tc_seen, params.kv_splits, split) : TileRange{0, Tc_seen};
    const int j_first = int(chunk.begin), j_end = int(chunk.end);

    // FA2 L4 (issued): Q_i -> shared memory, cp.async group 0.
    ops.load_q(Q_head, params.in.q.row, row_begin, seq_q);
    cp_async_commit();
    // FA2 L7 (issued ahead): the first kStages - 1 visible tiles K_j, V_j, one group each. Every
    // thread commits a group per slot even when there is nothing left to load, so that "wait
    // until at most N groups are pending" always means the same tile.
    int j_load = next_key_tile<kBlockMask>(p, rows, j_first, j_end, Bc);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (j_load < j_end) {
            ops.load_kv(s, K_head, V_head, params.in, j_load * Bc, seq_kv);
            j_load = next_key_tile<kBlockMask>(p, rows, j_load + 1, j_end, Bc);
        }
        cp_async_commit();
    }

    // FA2 L4 (completed): wait for Q_i alone; the Ops may keep it in registers.
    cp_async_wait<kStages - 1>();
    __syncthreads();
    ops.hold_q();

    // FA2 L5: O_i = 0, l_i = 0, m_i = -inf, for the warp's rows, in registers.
    float O[kM][Cfg::D / 8][4];
    RowSoftmax<Cfg, Ops::kExactDifference, Ops::kLazyRescale> softmax[kM];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int dt = 0; dt < Cfg::D / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) O[mt][dt][e] = 0.0f;

    int stage = 0;  // ring slot of tile j
    // FA2 L6: for each key tile j that the CTA can see.
    for (int j = next_key_tile<kBlockMask>(p, rows, j_first, j_end, Bc); j < j_end;
         j = next_key_tile<kBlockMask>(p, rows, j + 1, j_end, Bc)) {
        // FA2 L7: tile j has landed (at most kStages - 2 younger groups still in flight), and the
        // barrier makes it visible to all warps -- and tells us every warp is done with the slot
        // used in the previous iteration, which the next copy may now overwrite.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (j_load < j_end) {
            ops.load_kv((stage + kStages - 1) % kStages, K_head, V_head, params.in, j_load * Bc,
                        seq_kv);
            j_load = next_key_tile<kBlockMask>(p, rows, j_load + 1, j_end, Bc);
        }
        cp_async_commit();

        // The warp's own rows may see less of the tile than the CTA's (the causal diagonal).
        const TileRange cols = tile_range(j, Bc, seq_kv);
        const TileVisibility seen = warp_rows.size() > 0
                                        ? visibility<kBlockMask>(p, warp_rows, cols)
                                        : TileVisibility::none;
        if (seen != TileVisibility::none) {
            float S[kM][Bc / 8][4];
            ops.scores(S, stage);  // FA2 L8
            if (needs_element_mask(seen, cols, Bc)) {
#pragma unroll
                for (int mt = 0; mt < kM; ++mt)
                    mask_scores<Cfg, kBlockMask>(S[mt], p, warp_begin + 16 * mt, int(cols.begin),
                                                 lane);
            }
#pragma unroll
            for (int mt = 0; mt < kM; ++mt)  // FA2 L9, L10 (rescale)
                softmax[mt].update(S[mt], O[mt], params.scale_log2);
            ops.accumulate_pv(O, S, stage);  // FA2 L10 (+ P~ V_j)
        } else {
            ops.inspect_skipped(stage);
        }
        stage = (stage + 1) % kStages;
    }

    if (!ops.computed_tile()) return false;
    // FA2 L12-L15.
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
        if (warp_begin + 16 * mt < row_end)
            softmax[mt].template finalize<kBlockMask>(O[mt], params, warp_begin + 16 * mt, b, h, lane, split);
    return true;
}

}  // namespace flashattn::mma
