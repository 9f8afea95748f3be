// cuda/tc/backward_ops.cuh — cuda-tc's backward: the operand stages of FlashAttention-2's
// backward on fp16 / bf16 tensor cores (mma.sync m16n8k16, fp32 accumulation). The loop, the
// masks, P and dS, the dQ order and the writes are cuda/stages/flash_backward.cuh's, written once
// for both precisions (its header maps Algorithm 2 line by line); this file says how cuda-tc stores
// and multiplies the tiles. Host side: cuda/tc/backward.cu.
//
//  * Tiles of Q_i, K_j, V_j, dO_i are 16-bit, in the forward's swizzled layout (cuda/tc/kernel.cuh:
//    16-byte chunks XOR-ed by row, so ldmatrix reads are free of bank conflicts), loaded by the
//    forward's load_tile.
//  * S^T = K_j Q_i^T and dP^T = V_j dO_i^T are the forward's compute_scores with a warp's 16 keys
//    as its rows (KeyView); at d <= 64 a warp may keep its K_j and V_j fragments in registers.
//  * dV_j += P^T dO_i and dK_j += dS^T Q_i are the forward's accumulate_pv: P^T and dS^T, rounded
//    to 16 bits, are A fragments straight from the accumulators.
//  * dS^T goes to shared memory as 16-bit values for dQ_i = dS K_j, whose A operand ldmatrix .trans
//    reads back in (query, key) order.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "common/backward.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/stages/flash_backward.cuh"
#include "cuda/stages/mma_stages.cuh"
#include "cuda/tc/kernel.cuh"
#include "cuda/ptx/mma_sync.cuh"

namespace flashattn::tc {

using cuda::BackwardParams;

// The widest of 64 and 32 columns that divides D and gives every warp a piece of dQ_i (Br / 16
// row pieces times D / columns), else 16 (D is a multiple of 32 here: BackwardTile).
constexpr int dq_piece_columns(int D, int Br, int warps) {
    for (int cols : {64, 32})
        if (D % cols == 0 && (Br / 16) * (D / cols) >= warps) return cols;
    return 16;
}

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
    // dQ_i = dS K_j is cut into 16-row x kDqCols pieces, one per warp at a time: at most 64
    // columns, which keep the piece's accumulator at 32 floats per thread beside dK_j and dV_j,
    // and narrower where 64-column pieces would be fewer than the warps (the warps without one
    // would only wait at the next step's barrier: at d = 64 with Br = 64, 4 pieces for 8 warps).
    static constexpr int kDqCols = dq_piece_columns(D_, Br_, kWarps_);
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

// ---- dS^T and dQ ------------------------------------------------------------------------------

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
        cuda::add_dq_piece<Cfg::kDqCols / 8>(params, dQ_head, acc, row0 + 16 * rt, col0, lane);
    }
}

// ---- the operand stages ----------------------------------------------------------------------

// What cuda/stages/flash_backward.cuh's backward_kernel asks of a precision, for 16-bit tiles.
template <class Cfg>
struct TcBackwardOps {
    using T = typename Cfg::T;
    using KV = KeyView<Cfg>;
    static constexpr int Br = Cfg::Br, Bc = Cfg::Bc, D = Cfg::D;
    static constexpr int kThreads = Cfg::kThreads, kSmemBytes = Cfg::kSmemBytes;
    static constexpr bool kExactExp = false;    // the exp2 form of the forward (fp16/bf16)
    static constexpr bool kQSignFolded = true;  // Q arrives as q_sign Q: dK's scale is |scale|

    // Shared memory: K_j, V_j; 2 slots of Q_i and of dO_i; dS^T (Bc x Br); 2 slots of L_i, D_i.
    struct Shared {
        T *K, *V, *Q0, *dO0, *dS;
        float *L0, *Delta0;
        __device__ explicit Shared(void* base) {
            K = static_cast<T*>(base), V = K + Bc * D, Q0 = V + Bc * D;
            dO0 = Q0 + Cfg::kStages * Br * D, dS = dO0 + Cfg::kStages * Br * D;
            L0 = reinterpret_cast<float*>(dS + Bc * Br), Delta0 = L0 + Cfg::kStages * Br;
        }
        __device__ T* Q(int slot) const { return Q0 + slot * Br * D; }
        __device__ T* dO(int slot) const { return dO0 + slot * Br * D; }
        __device__ float* L(int slot) const { return L0 + slot * Br; }
        __device__ float* Delta(int slot) const { return Delta0 + slot * Br; }
    };

    // A warp's 16 keys of K_j and V_j as A fragments, for the whole loop (kKVInRegisters).
    struct KeyFragments {
        std::uint32_t k[1][D / 16][4], v[1][D / 16][4];
        __device__ void load(const Shared& sh, int warp, int lane) {
            if constexpr (Cfg::kKVInRegisters) {
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    load_q_fragment<KV>(k[0][kk], sh.K, warp, 0, kk, lane);
                    load_q_fragment<KV>(v[0][kk], sh.V, warp, 0, kk, lane);
                }
            }
        }
    };

    // L6: K_j, V_j (rows past N_kv zero-filled).
    static __device__ void load_keys(const BackwardParams& params, const Shared& sh,
                                     std::int64_t b, std::int64_t g, int j) {
        const int n = int(params.problem.seq_kv);
        const ArrayLayout &k = params.in.k, &v = params.in.v;
        const T *K = static_cast<const T*>(params.K), *V = static_cast<const T*>(params.V);
        load_tile<Cfg, Bc>(sh.K, K + k.offset(b, g), j * Bc, n);
        load_tile<Cfg, Bc>(sh.V, V + v.offset(b, g), j * Bc, n);
    }

    // L9: Q_i, dO_i (rows past N_q zero-filled), L_i and D_i of query tile i, head h.
    static __device__ void load_query_step(const BackwardParams& params, const Shared& sh, int slot,
                                           std::int64_t b, std::int64_t h, int i) {
        const int n = int(params.problem.seq_q);
        const ArrayLayout &q = params.in.q, &dO = params.do_layout;
        const T *Q = static_cast<const T*>(params.Q), *dO_ = static_cast<const T*>(params.dO);
        load_tile<Cfg, Br>(sh.Q(slot), Q + q.offset(b, h), i * Br, n);
        load_tile<Cfg, Br>(sh.dO(slot), dO_ + dO.offset(b, h), i * Br, n);
        cuda::load_row_statistics<Br, kThreads>(params, b, h, i, sh.L(slot), sh.Delta(slot));
    }

    // L10: S^T = K_j Q_i^T (raw scores; Q_i already carries q_sign).
    static __device__ void scores(float (&S)[Br / 8][4], const KeyFragments& f, const Shared& sh,
                                  int slot, const BackwardParams&, int warp, int lane) {
        compute_scores<KV>(as_tiles(S), f.k, sh.K, sh.Q(slot), warp, lane);
    }
    // L13: dP^T = V_j dO_i^T.
    static __device__ void output_scores(float (&dP)[Br / 8][4], const KeyFragments& f,
                                         const Shared& sh, int slot, int warp, int lane) {
        compute_scores<KV>(as_tiles(dP), f.v, sh.V, sh.dO(slot), warp, lane);
    }
    // L12: dV_j += P^T dO_i.
    static __device__ void accumulate_dv(float (&dV)[D / 8][4], float (&P)[Br / 8][4],
                                         const Shared& sh, int slot, int lane) {
        accumulate_pv<KV>(as_tiles(dV), as_tiles(P), sh.dO(slot), lane);
    }
    // L16: dK_j += dS^T Q_i.
    static __device__ void accumulate_dk(float (&dK)[D / 8][4], float (&dS)[Br / 8][4],
                                         const Shared& sh, int slot, int lane) {
        accumulate_pv<KV>(as_tiles(dK), as_tiles(dS), sh.Q(slot), lane);
    }
    static __device__ void store_score_gradients(const Shared& sh, const float (&dS)[Br / 8][4],
                                                 int warp, int lane) {
        tc::store_score_gradients<Cfg>(sh.dS, dS, warp, lane);
    }
    // L15.
    static __device__ void accumulate_dq(const BackwardParams& params, float* dQ_head,
                                         const Shared& sh, int row0, int warp, int lane) {
        tc::accumulate_dq<Cfg>(params, dQ_head, sh.dS, sh.K, row0, warp, lane);
    }

private:
    // The forward's stages take [kMTiles = 1][tiles][4]; the backward's arrays are [tiles][4].
    template <int N>
    static __device__ float (&as_tiles(float (&x)[N][4]))[1][N][4] {
        return *reinterpret_cast<float(*)[1][N][4]>(&x);
    }
};

}  // namespace flashattn::tc
