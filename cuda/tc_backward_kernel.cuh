// cuda/tc_backward_kernel.cuh — cuda-tc's backward pass: FlashAttention-2's backward on tensor
// cores (fp16 / bf16 Q, K, V, dO; fp32 accumulation, P, dS, dQ, dK, dV). Host side (tile shapes,
// launches, the D pass, the deterministic mode): cuda/tc_backward.cu.
//
// FlashAttention-2, Algorithm 2 (backward; Dao 2023, arXiv 2307.08691), and where each line lives.
// The rule (P from L, D = rowsum(dO o O), dS = P o (dP - D)) is common/backward.hpp's.
//
//   L4    D_i = rowsum(dO_i o O_i)             delta_kernel (cuda/backward_stages.cuh), first
//   L5    for 1 <= j <= Tc                     one CTA per (j, b, K/V head)
//   L6      load K_j, V_j to SRAM              load_tile (cp.async), then registers at d <= 64
//   L7      dK_j = 0, dV_j = 0                 registers
//   L8      for 1 <= i <= Tr                   the step loop (every query head of the GQA group)
//   L9        load Q_i, O_i... dO_i, L_i, D_i  load_query_step (cp.async ring of 2)
//   L10       S_ij = Q_i K_j^T                 compute_scores, as S^T = K_j Q_i^T
//   L11       P_ij = exp(S_ij - L_i)           recomputed_probability_exp2 (+ masks)
//   L12       dV_j += P_ij^T dO_i              accumulate_pv (the forward's P V product)
//   L13       dP_ij = dO_i V_j^T               compute_scores, as dP^T = V_j dO_i^T
//   L14       dS_ij = P_ij o (dP_ij - D_i)     score_gradient
//   L15       dQ_i += dS_ij K_j                accumulate_dq, added to HBM with atomics
//   L16       dK_j += dS_ij^T Q_i              accumulate_pv
//   L19   write dK_j, dV_j                     write_key_gradients
//
// How the work is laid out, and why:
//
//  * Transposed tiles. Each warp owns 16 keys of K_j (Bc = 16 warps) and computes S^T = K_j Q_i^T
//    and dP^T = V_j dO_i^T for them: the m16n8 accumulators then hold rows = keys, which is what
//    dV_j += P^T dO_i and dK_j += dS^T Q_i need as their A operand. Exactly as in the forward's
//    P~ V product, the fp32 accumulators of P^T and dS^T become A fragments once rounded to 16
//    bits, with no trip through shared memory; so the forward's compute_scores and accumulate_pv
//    (cuda/tc_kernel.cuh) serve here unchanged, on views (KeyView, QueryView) that name which
//    tile plays which role.
//  * dK_j and dV_j stay in registers (d/2 floats each per thread) for the whole loop; every query
//    tile of every query head of the GQA group streams past, so the group's sum is formed in place
//    and written once, without atomics.
//  * dQ_i needs a sum over all keys of the tile, across warps: dS^T goes to shared memory (16
//    bits), and the warps then split dQ_i = dS K_j by (16 rows x 64 columns) and add their part to
//    dQ in HBM with fp32 atomics (FlashAttention-2's choice). The order of those additions varies
//    from run to run, and so may dQ's last bits. kDeterministic makes the order fixed: the CTAs of
//    one query tile add in the order of their key tiles, each waiting for its turn on a counter
//    (FlashAttention-3's deterministic mode does the same). docs/cuda_backward.md measures both.
//  * Masks as in the forward: per warp, classify_tile says whether its 16 keys x Br queries are
//    fully visible (no test), partly (P = dS = 0 where hidden) or not at all (skipped). A key tile
//    visits only the query tiles that can see it (next_visible_tile), so under a causal mask the
//    loop starts at the diagonal.
//  * Ragged tails: the copies zero-fill rows past N_q and N_kv, and such a tile is masked as a
//    partial one, so padding rows add nothing (P = 0, not exp(0 - L)).
//  * A masked pair is left out where it can be: P = dS = 0. Inside a partly visible tile it still
//    enters the tensor-core products as 0 times its dO_i or Q_i row, so an inf or NaN in an input
//    reaches, besides the gradients that read it, the others of its 16 x 64 tile. The fp32 forms
//    (cuda-fa2, cpu) skip such pairs exactly; tests/test_cuda_tc_backward.cpp checks this form's
//    contract.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/backward.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/mma_stages.cuh"
#include "cuda/tc_kernel.cuh"
#include "cuda/tc_ptx.cuh"

namespace flashattn::tc {

// Everything the kernel reads; passed by value.
struct BackwardParams {
    const void* Q;   // (B, H, N_q, d) of T, times q_sign (as the forward's)
    const void* K;   // (B, H_kv, N_kv, d) of T
    const void* V;   // (B, H_kv, N_kv, d) of T
    const void* dO;  // (B, H, N_q, d) of T
    const float* lse;  // (B, H, N_q): the forward's L
    const float* D;    // (B, H, N_q): rowsum(dO o O), from delta_kernel
    float* dQ;         // (B, H, N_q, d), zero before the launch: the kernel adds to it
    float* dK;         // (B, H_kv, N_kv, d), written once
    float* dV;
    int* dq_turns;  // kDeterministic: (B, H, Tr) counters, zero before the launch
    AttentionProblem problem;  // its block_mask.data (if any) points to device memory
    float scale_log2;          // c = |scale| log2(e), as the forward's
    float scale;               // the signed softmax scale: dQ = scale dS K
    float abs_scale;           // dK = |scale| dS^T (q_sign Q)
};

// The compile-time shape of one CTA: kWarps warps of 16 keys each (Bc = 16 kWarps), query tiles of
// Br rows, K_j and V_j fragments in registers or re-read from shared memory.
template <class T_, int D_, int kWarps_, int Br_, bool kKVInRegisters_>
struct BackwardTile {
    using T = T_;
    static constexpr int D = D_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = 32 * kWarps_;
    static constexpr int Bc = 16 * kWarps_;  // keys per CTA
    static constexpr int Br = Br_;           // query rows per step
    static constexpr int kChunks = D_ / 8;   // 16-byte chunks per row of Q, K, V, dO
    static constexpr int kStages = 2;        // Q_i / dO_i ring
    static constexpr bool kKVInRegisters = kKVInRegisters_;
    // dQ_i = dS K_j is cut into 16-row x kDqCols pieces, one per warp at a time: 64 columns keep
    // the piece's accumulator at 32 floats per thread beside dK_j and dV_j.
    static constexpr int kDqCols = D_ % 64 == 0 ? 64 : 32;
    // Shared memory: K_j, V_j; kStages x (Q_i, dO_i); dS^T (Bc x Br); kStages x (L_i, D_i).
    static constexpr int kSmemBytes =
        (2 * Bc * D_ + kStages * 2 * Br_ * D_ + Bc * Br_) * int(sizeof(T_)) +
        kStages * 2 * Br_ * int(sizeof(float));

    static_assert(D_ % 32 == 0 && D_ <= 128, "the backward's d is a multiple of 32 up to 128");
    static_assert(Br_ % 32 == 0, "Br must give dS^T rows of whole 16-byte chunk pairs");
};

// The forward's stages see "Q_i" (the A rows of a warp), "K_j" (Bc rows streamed as B) and d.
// KeyView: S^T = K_j Q_i^T (and dP^T = V_j dO_i^T): a warp's 16 keys are the rows, the Br query
// rows of the step play the forward's keys.
template <class Cfg>
struct KeyView {
    using T = typename Cfg::T;
    static constexpr int D = Cfg::D, kChunks = Cfg::kChunks;
    static constexpr int kMTiles = 1, kWarpRows = 16;
    static constexpr int Bc = Cfg::Br;
    static constexpr bool kQInRegisters = Cfg::kKVInRegisters;
};

// A warp's 16 keys of K_j (or V_j) as A fragments, for the whole loop (kKVInRegisters).
template <class Cfg>
using KeyFragments = std::uint32_t[1][Cfg::D / 16][4];

// ---- one step's loads ------------------------------------------------------------------------

// Algorithm 2 L9: Q_i, dO_i (16-bit, swizzled), L_i and D_i of query tile i, head h, into ring
// slot `slot`; rows past N_q are zero-filled (their L = D = 0 is never used: they are masked).
template <class Cfg>
__device__ __forceinline__ void load_query_step(const BackwardParams& params, std::int64_t b,
                                                std::int64_t h, int i, typename Cfg::T* sQ,
                                                typename Cfg::T* sdO, float* sL, float* sD) {
    using T = typename Cfg::T;
    const AttentionProblem& p = params.problem;
    const int seq_q = int(p.seq_q);
    load_tile<Cfg, Cfg::Br>(sQ, static_cast<const T*>(params.Q) + p.q_offset(b, h), i * Cfg::Br, seq_q);
    load_tile<Cfg, Cfg::Br>(sdO, static_cast<const T*>(params.dO) + p.q_offset(b, h), i * Cfg::Br, seq_q);
    for (int r = int(threadIdx.x); r < Cfg::Br; r += Cfg::kThreads) {
        const int row = i * Cfg::Br + r;
        const bool valid = row < seq_q;
        const std::int64_t at = p.lse_offset(b, h) + (valid ? row : 0);
        cp_async_4(sL + r, params.lse + at, valid);
        cp_async_4(sD + r, params.D + at, valid);
    }
}

// ---- P and dS ------------------------------------------------------------------------------

// Algorithm 2 L11 and L14 on a warp's S^T and dP^T accumulators, in place: S becomes P^T and dP
// becomes dS^T. Entry (nt, e) is key key0 + lane / 4 + 8 (e / 2), query row0 + 8 nt + 2 (lane % 4)
// + e % 2. kMasked (a partly visible tile, or a ragged one): hidden pairs get P = dS = 0.
template <class Cfg, bool kBlockMask, bool kMasked>
__device__ __forceinline__ void probabilities_and_score_gradients(
    float (&S)[Cfg::Br / 8][4], float (&dP)[Cfg::Br / 8][4], const float* sL, const float* sD,
    const AttentionProblem& p, float scale_log2, int row0, int key0, int lane) {
#pragma unroll
    for (int nt = 0; nt < Cfg::Br / 8; ++nt) {
        const int q = 8 * nt + 2 * (lane % 4);
        const float2 L = *reinterpret_cast<const float2*>(sL + q);
        const float2 D = *reinterpret_cast<const float2*>(sD + q);
        const float shift[2] = {lse_shift(L.x), lse_shift(L.y)};
        const float delta[2] = {D.x, D.y};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float P = recomputed_probability_exp2(S[nt][e], shift[e % 2], scale_log2);
            float dS = score_gradient(P, dP[nt][e], delta[e % 2]);
            if constexpr (kMasked) {
                const int row = row0 + q + e % 2;
                const int key = key0 + lane / 4 + 8 * (e / 2);
                bool visible = row < p.seq_q && key < p.seq_kv;
                if constexpr (kBlockMask)
                    visible = visible && p.key_visible(row, key);
                else
                    visible = visible && (!p.causal || key <= row + p.causal_offset());
                if (!visible) P = 0.0f, dS = 0.0f;
            }
            S[nt][e] = P;
            dP[nt][e] = dS;
        }
    }
}

// dS^T (a warp's 16 keys x Br queries) to shared memory as 16-bit values, swizzled by rows of
// Br / 8 chunks, for the dQ product; all zeros where the warp's keys see nothing of the step.
template <class Cfg>
__device__ __forceinline__ void store_score_gradients(typename Cfg::T* sdS,
                                                      const float (&dS)[Cfg::Br / 8][4], int warp,
                                                      int lane) {
    constexpr int kChunksS = Cfg::Br / 8;
#pragma unroll
    for (int nt = 0; nt < Cfg::Br / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = 16 * warp + lane / 4 + 8 * r;
            *reinterpret_cast<std::uint32_t*>(sdS + swizzled_chunk<kChunksS>(key, nt) * 8 +
                                              2 * (lane % 4)) =
                pack2<typename Cfg::T>(dS[nt][2 * r], dS[nt][2 * r + 1]);
        }
}

// ---- dQ ------------------------------------------------------------------------------------

// The query turn of key tile j on query tile `rows`: how many key tiles before j add to the same
// dQ_i. Without a block mask the key tiles a query tile sees are a prefix (0 .. its diagonal), so
// it is j; with one, the visible tiles before j are counted.
template <bool kBlockMask>
__device__ __forceinline__ int dq_turn(const AttentionProblem& p, TileRange rows, int j, int Bc) {
    if constexpr (!kBlockMask) return j;
    int turn = 0;
    for (std::int64_t t = next_visible_tile(p, TileAxis::keys, rows, 0, j, Bc); t < j;
         t = next_visible_tile(p, TileAxis::keys, rows, t + 1, j, Bc))
        ++turn;
    return turn;
}

// Algorithm 2 L15: dQ_i += scale dS K_j, in 16-row x kDqCols pieces shared out over the warps.
// A = dS (queries x keys) from dS^T in shared memory: ldmatrix .trans turns its (key, query)
// rows into the fragment's (query, key) ones. B = K_j (keys x d), row-major, so .trans as for V
// in the forward's P V. Each piece is added to HBM with fp32 atomics (two floats at a time).
template <class Cfg>
__device__ __forceinline__ void accumulate_dq(const BackwardParams& params, float* dQ_head,
                                              const typename Cfg::T* sdS,
                                              const typename Cfg::T* sK, int row0, int warp,
                                              int lane) {
    using T = typename Cfg::T;
    constexpr int kChunksS = Cfg::Br / 8;
    constexpr int kColPieces = Cfg::D / Cfg::kDqCols;
    const int seq_q = int(params.problem.seq_q);
    for (int piece = warp; piece < (Cfg::Br / 16) * kColPieces; piece += Cfg::kWarps) {
        const int rt = piece / kColPieces, col0 = (piece % kColPieces) * Cfg::kDqCols;
        if (row0 + 16 * rt >= seq_q) continue;
        float acc[Cfg::kDqCols / 8][4];
#pragma unroll
        for (int nt = 0; nt < Cfg::kDqCols / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < Cfg::Bc / 16; ++kk) {
            std::uint32_t a[4];
            const int key_a = 16 * kk + lane % 8 + 8 * (lane / 16);
            ldmatrix_x4_trans(a, sdS + swizzled_chunk<kChunksS>(key_a, 2 * rt + (lane / 8) % 2) * 8);
#pragma unroll
            for (int dn = 0; dn < Cfg::kDqCols / 16; ++dn) {
                std::uint32_t bk[4];
                const int key_b = 16 * kk + lane % 8 + 8 * ((lane / 8) % 2);
                ldmatrix_x4_trans(
                    bk, sK + swizzled_chunk<Cfg::kChunks>(key_b, col0 / 8 + 2 * dn + lane / 16) * 8);
                mma_m16n8k16<T>(acc[2 * dn], a, bk[0], bk[1]);
                mma_m16n8k16<T>(acc[2 * dn + 1], a, bk[2], bk[3]);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 16 * rt + lane / 4 + 8 * r;
            if (row >= seq_q) continue;
            float* out = dQ_head + std::int64_t(row) * Cfg::D + col0 + 2 * (lane % 4);
#pragma unroll
            for (int nt = 0; nt < Cfg::kDqCols / 8; ++nt) {
#if __CUDA_ARCH__ >= 900
                atomicAdd(reinterpret_cast<float2*>(out + 8 * nt),
                          make_float2(params.scale * acc[nt][2 * r], params.scale * acc[nt][2 * r + 1]));
#else
                atomicAdd(out + 8 * nt, params.scale * acc[nt][2 * r]);
                atomicAdd(out + 8 * nt + 1, params.scale * acc[nt][2 * r + 1]);
#endif
            }
        }
    }
}

// ---- the kernel ------------------------------------------------------------------------------
// Grid: (Tc, batch x K/V heads); block: Cfg::kThreads; dynamic shared memory: Cfg::kSmemBytes.
// Key tile 0 sees the most query tiles under a causal mask and is launched first.
template <class Cfg, bool kBlockMask, bool kDeterministic>
__global__ void __launch_bounds__(Cfg::kThreads) tc_backward_kernel(const BackwardParams params) {
    using T = typename Cfg::T;
    using KV = KeyView<Cfg>;
    constexpr int Br = Cfg::Br, Bc = Cfg::Bc, D = Cfg::D;
    extern __shared__ uint4 smem[];
    T* sK = reinterpret_cast<T*>(smem);
    T* sV = sK + Bc * D;
    T* sQ = sV + Bc * D;                    // kStages slots of Br x D
    T* sdO = sQ + Cfg::kStages * Br * D;    // kStages slots of Br x D
    T* sdS = sdO + Cfg::kStages * Br * D;   // Bc x Br
    float* sL = reinterpret_cast<float*>(sdS + Bc * Br);  // kStages slots of Br
    float* sD = sL + Cfg::kStages * Br;                   // kStages slots of Br

    const AttentionProblem& p = params.problem;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int seq_q = int(p.seq_q), seq_kv = int(p.seq_kv);
    const int Tr = int(tile_count(seq_q, Br));

    // L5: key tile j of K/V head g, batch b; its query heads are h0 .. h0 + G - 1.
    const int j = int(blockIdx.x);
    const std::int64_t b = blockIdx.y / p.heads_kv, g = blockIdx.y % p.heads_kv;
    const std::int64_t G = p.group_size(), h0 = g * G;
    const TileRange cols = {j * Bc, min(j * Bc + Bc, seq_kv)};
    const int key0 = j * Bc + 16 * warp;
    const TileRange warp_cols = {min(key0, seq_kv), min(key0 + 16, seq_kv)};
    const std::int64_t kv_off = p.kv_offset(b, h0);

    // L6: K_j, V_j (cp.async group 0, with the first step's Q_i, dO_i).
    load_tile<Cfg, Bc>(sK, static_cast<const T*>(params.K) + kv_off, j * Bc, seq_kv);
    load_tile<Cfg, Bc>(sV, static_cast<const T*>(params.V) + kv_off, j * Bc, seq_kv);

    // L8: the steps are (h, i) for every query head of the group and every query tile that can
    // see key tile j, in order; `next` finds the one after (h, i), h = h0 + G when none is left.
    const auto next = [&](std::int64_t& h, int& i) {
        i = int(next_visible_tile(p, TileAxis::queries, cols, i + 1, Tr, Br));
        while (i >= Tr && ++h < h0 + G) i = int(next_visible_tile(p, TileAxis::queries, cols, 0, Tr, Br));
    };
    std::int64_t h = h0;
    int i = -1;
    next(h, i);
    if (h < h0 + G) load_query_step<Cfg>(params, b, h, i, sQ, sdO, sL, sD);
    cp_async_commit();

    // L7: dK_j = 0, dV_j = 0, in this warp's registers (its 16 keys x d).
    float dK[1][D / 8][4], dV[1][D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dK[0][dt][e] = dV[0][dt][e] = 0.0f;

    KeyFragments<Cfg> k_frag, v_frag;
    int slot = 0;
    bool first = true;
    while (h < h0 + G) {
        std::int64_t h_next = h;
        int i_next = i;
        next(h_next, i_next);
        // This step's tiles have landed, and every warp is done with the previous step (its slot,
        // which the next copy overwrites, and dS^T, which this step rewrites).
        cp_async_wait<0>();
        __syncthreads();
        if (h_next < h0 + G)
            load_query_step<Cfg>(params, b, h_next, i_next, sQ + (slot ^ 1) * Br * D,
                                 sdO + (slot ^ 1) * Br * D, sL + (slot ^ 1) * Br,
                                 sD + (slot ^ 1) * Br);
        cp_async_commit();
        if constexpr (Cfg::kKVInRegisters) {
            if (first) {
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    load_q_fragment<KV>(k_frag[0][kk], sK, warp, 0, kk, lane);
                    load_q_fragment<KV>(v_frag[0][kk], sV, warp, 0, kk, lane);
                }
            }
        }
        first = false;

        const T* sQi = sQ + slot * Br * D;
        const T* sdOi = sdO + slot * Br * D;
        const TileRange rows = {i * Br, min(i * Br + Br, seq_q)};
        const TileVisibility seen = warp_cols.size() > 0
                                        ? mma::visibility<kBlockMask>(p, rows, warp_cols)
                                        : TileVisibility::none;
        float S[1][Br / 8][4], dP[1][Br / 8][4];
        if (seen != TileVisibility::none) {
            compute_scores<KV>(S, k_frag, sK, sQi, warp, lane);    // L10: S^T = K_j Q_i^T
            compute_scores<KV>(dP, v_frag, sV, sdOi, warp, lane);  // L13: dP^T = V_j dO_i^T
            const float* sLi = sL + slot * Br;
            const float* sDi = sD + slot * Br;
            if (seen == TileVisibility::partial || rows.size() < Br || warp_cols.size() < 16)
                probabilities_and_score_gradients<Cfg, kBlockMask, true>(
                    S[0], dP[0], sLi, sDi, p, params.scale_log2, rows.begin, key0, lane);
            else
                probabilities_and_score_gradients<Cfg, kBlockMask, false>(
                    S[0], dP[0], sLi, sDi, p, params.scale_log2, rows.begin, key0, lane);
            accumulate_pv<KV>(dV, S, sdOi, lane);  // L12: dV_j += P^T dO_i
            accumulate_pv<KV>(dK, dP, sQi, lane);  // L16: dK_j += dS^T Q_i (unscaled)
        } else {
#pragma unroll
            for (int nt = 0; nt < Br / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) dP[0][nt][e] = 0.0f;
        }
        store_score_gradients<Cfg>(sdS, dP[0], warp, lane);
        __syncthreads();  // dS^T complete

        // L15: dQ_i += scale dS K_j; in kDeterministic mode after the key tiles before this one.
        int* turn = nullptr;
        if constexpr (kDeterministic) {
            turn = params.dq_turns + (b * p.heads + h) * Tr + i;
            if (threadIdx.x == 0) {
                const int mine = dq_turn<kBlockMask>(p, rows, j, Bc);
                while (*static_cast<volatile int*>(turn) != mine) {
                }
                __threadfence();
            }
            __syncthreads();
        }
        accumulate_dq<Cfg>(params, params.dQ + p.q_offset(b, h), sdS, sK, rows.begin, warp, lane);
        if constexpr (kDeterministic) {
            __threadfence();  // this tile's additions are done before the next tile's turn
            __syncthreads();
            if (threadIdx.x == 0) atomicAdd(turn, 1);
        }
        h = h_next, i = i_next;
        slot ^= 1;
    }
    cp_async_wait<0>();  // a CTA with no step still has K_j, V_j in flight

    // L19: dK_j = |scale| sum dS^T (q_sign Q), dV_j; rows past N_kv are not written.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = key0 + lane / 4 + 8 * r;
        if (key >= seq_kv) continue;
        float* dK_row = params.dK + kv_off + std::int64_t(key) * D + 2 * (lane % 4);
        float* dV_row = params.dV + kv_off + std::int64_t(key) * D + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            *reinterpret_cast<float2*>(dK_row + 8 * dt) =
                make_float2(params.abs_scale * dK[0][dt][2 * r], params.abs_scale * dK[0][dt][2 * r + 1]);
            *reinterpret_cast<float2*>(dV_row + 8 * dt) =
                make_float2(dV[0][dt][2 * r], dV[0][dt][2 * r + 1]);
        }
    }
}

}  // namespace flashattn::tc
