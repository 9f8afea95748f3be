// cuda/fa2/backward_tf32.cuh — cuda-fa2's backward on tensor cores: the operand stages of
// FlashAttention-2's backward in float32 as 3xTF32 products (cuda/ptx/tf32_mma.cuh says why three
// tf32 products are as accurate as fp32 FMAs). The loop, the masks, P and dS, the dQ order and the
// writes are cuda/stages/flash_backward.cuh's, shared with cuda-tc (its header maps Algorithm 2
// line by line); this file says how the fp32 tiles are stored and multiplied. Host side:
// cuda/fa2/backward.cu, which runs this kernel for 16 <= d <= 128 and finite inputs and the FFMA
// kernels (cuda/fa2/backward_ffma.cuh) otherwise.
//
//  * Tiles are fp32 in shared memory, rows padded to D + 4 floats (D = 64 or 128, the columns past
//    d zero-filled by the copy), and split into big + small tf32 values as they are read.
//  * S^T = K_j Q_i^T and dP^T = V_j dO_i^T are the forward's tf32_scores (cuda/fa2/kernel_tf32.cuh)
//    with a warp's 16 keys as its rows; the scale's sign is applied to K_j's values as they are
//    read, so that S^T has the sign of the scaled scores (dK then takes the signed scale).
//  * dV_j += P^T dO_i and dK_j += dS^T Q_i are the forward's tf32_accumulate_pv: the fp32
//    accumulators of P^T and dS^T are A fragments under its renumbering of k.
//  * Each k-step's three products go into a fresh accumulator that is then added in fp32, as in
//    the forward (a tensor core truncates its sums; see cuda/fa2/kernel_tf32.cuh, "Accuracy"). dQ_i
//    = dS K_j does the same, reading dS^T back from shared memory.
//  * P = exp(|scale| s - L) with expf, not the exp2 shortcut: the fp32 kernel is held to fp32
//    standard attention's accuracy.
#pragma once

#include <cstdint>

#include "cuda/stages/flash_backward.cuh"
#include "cuda/fa2/kernel_tf32.cuh"
#include "cuda/ptx/tf32_mma.cuh"

namespace flashattn::cuda {

// One CTA: kWarps warps of 16 keys each (Bc = 16 kWarps), query tiles of Br rows, head dim padded
// to D.
template <int D_, int kWarps_, int Br_>
struct Tf32BackwardTile {
    static constexpr int D = D_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = 32 * kWarps_;
    static constexpr int Bc = 16 * kWarps_;
    static constexpr int Br = Br_;
    static constexpr int kStages = 2;
    // Rows of K_j, V_j, Q_i, dO_i: D + 4 floats. Each of these tiles is read both as tf32_scores'
    // 16-byte rows and as tf32_accumulate_pv's B (lanes (g, t) at row 2t, column g: banks
    // 8t + g, all distinct with D + 4).
    static constexpr int kStride = D_ + 4;
    // Rows of dS^T (keys x queries): Br + 4 floats, so that dQ's A reads (key 2t, query g) hit
    // banks 8t + g.
    static constexpr int kDSStride = Br_ + 4;
    // dQ_i = dS K_j (Br x D) is cut into 16-row pieces of kDqCols columns, one per warp, so that
    // every warp has one: between the barrier for dS^T and the next step's, the warps without a
    // piece would only wait (64-column pieces would leave 6 of 8 warps idle at D = 64, Br = 32).
    static constexpr int kDqCols = D_ * (Br_ / 16) / kWarps_;
    static constexpr int kSmemFloats =
        2 * Bc * kStride + kStages * 2 * Br_ * kStride + Bc * kDSStride + kStages * 2 * Br_;
    static constexpr int kSmemBytes = kSmemFloats * int(sizeof(float));

    static_assert(D_ == 64 || D_ == 128, "tf32_accumulate_pv works in passes of 64 columns");
    static_assert(Br_ % 16 == 0, "dQ_i is cut into 16-row pieces");
    static_assert(kDqCols % 8 == 0 && D_ % kDqCols == 0 && (Br_ / 16) * (D_ / kDqCols) == kWarps_,
                  "one dQ_i piece of whole n8 tiles per warp");
};

// The forward's stages read Bc (the B rows), D, and the row strides; here the B rows are the
// step's Br queries and every tile has the same stride.
template <class Cfg>
struct Tf32QueryView {
    static constexpr int D = Cfg::D, Bc = Cfg::Br, kThreads = Cfg::kThreads;
    static constexpr int kQKStride = Cfg::kStride, kVStride = Cfg::kStride;
};

template <class Cfg>
struct Tf32BackwardOps {
    using View = Tf32QueryView<Cfg>;
    static constexpr int Br = Cfg::Br, Bc = Cfg::Bc, D = Cfg::D;
    static constexpr int kThreads = Cfg::kThreads, kSmemBytes = Cfg::kSmemBytes;
    static constexpr bool kExactExp = true;      // expf: fp32 accuracy
    static constexpr bool kQSignFolded = false;  // Q is read as given: dK's scale is the signed one

    // Shared memory: K_j, V_j; 2 slots of Q_i and of dO_i; dS^T; 2 slots of L_i and D_i.
    struct Shared {
        float *K, *V, *Q0, *dO0, *dS, *L0, *Delta0;
        __device__ explicit Shared(void* base) {
            K = static_cast<float*>(base), V = K + Bc * Cfg::kStride, Q0 = V + Bc * Cfg::kStride;
            dO0 = Q0 + Cfg::kStages * Br * Cfg::kStride;
            dS = dO0 + Cfg::kStages * Br * Cfg::kStride;
            L0 = dS + Bc * Cfg::kDSStride, Delta0 = L0 + Cfg::kStages * Br;
        }
        __device__ float* Q(int slot) const { return Q0 + slot * Br * Cfg::kStride; }
        __device__ float* dO(int slot) const { return dO0 + slot * Br * Cfg::kStride; }
        __device__ float* L(int slot) const { return L0 + slot * Br; }
        __device__ float* Delta(int slot) const { return Delta0 + slot * Br; }
    };

    // K_j and V_j are re-read (and split) from shared memory at every step: split in registers they
    // would take 2 D registers per thread beside dK_j and dV_j.
    struct KeyFragments {
        __device__ void load(const Shared&, int, int) {}
    };

    // L6: K_j, V_j (rows past N_kv and columns past d zero-filled).
    static __device__ void load_keys(const BackwardParams& params, const Shared& sh,
                                     std::int64_t b, std::int64_t g, int j) {
        const AttentionProblem& p = params.problem;
        const int n = int(p.seq_kv), d = int(p.dim);
        const ArrayLayout &k = params.in.k, &v = params.in.v;
        tf32_load_tile<View, Bc, Cfg::kStride>(
            sh.K, static_cast<const float*>(params.K) + k.offset(b, g), int(k.row), j * Bc, n, d);
        tf32_load_tile<View, Bc, Cfg::kStride>(
            sh.V, static_cast<const float*>(params.V) + v.offset(b, g), int(v.row), j * Bc, n, d);
    }

    // L9: Q_i, dO_i, L_i and D_i of query tile i, head h.
    static __device__ void load_query_step(const BackwardParams& params, const Shared& sh, int slot,
                                           std::int64_t b, std::int64_t h, int i) {
        const AttentionProblem& p = params.problem;
        const int n = int(p.seq_q), d = int(p.dim);
        const ArrayLayout &q = params.in.q, &dO = params.do_layout;
        tf32_load_tile<View, Br, Cfg::kStride>(
            sh.Q(slot), static_cast<const float*>(params.Q) + q.offset(b, h), int(q.row), i * Br, n,
            d);
        tf32_load_tile<View, Br, Cfg::kStride>(
            sh.dO(slot), static_cast<const float*>(params.dO) + dO.offset(b, h), int(dO.row), i * Br,
            n, d);
        load_row_statistics<Br, kThreads>(params, b, h, i, sh.L(slot), sh.Delta(slot));
    }

    // L10: S^T = (q_sign K_j) Q_i^T, raw scores with the scale's sign.
    static __device__ void scores(float (&S)[Br / 8][4], const KeyFragments&, const Shared& sh,
                                  int slot, const BackwardParams& params, int warp, int lane) {
        const float q_sign = params.scale < 0 ? -1.0f : 1.0f;
        tf32_scores<View>(S, sh.K + 16 * warp * Cfg::kStride, q_sign, sh.Q(slot), lane);
    }
    // L13: dP^T = V_j dO_i^T.
    static __device__ void output_scores(float (&dP)[Br / 8][4], const KeyFragments&,
                                         const Shared& sh, int slot, int warp, int lane) {
        tf32_scores<View>(dP, sh.V + 16 * warp * Cfg::kStride, 1.0f, sh.dO(slot), lane);
    }
    // L12: dV_j += P^T dO_i.
    static __device__ void accumulate_dv(float (&dV)[D / 8][4], float (&P)[Br / 8][4],
                                         const Shared& sh, int slot, int lane) {
        tf32_accumulate_pv<View>(dV, P, sh.dO(slot), lane);
    }
    // L16: dK_j += dS^T Q_i.
    static __device__ void accumulate_dk(float (&dK)[D / 8][4], float (&dS)[Br / 8][4],
                                         const Shared& sh, int slot, int lane) {
        tf32_accumulate_pv<View>(dK, dS, sh.Q(slot), lane);
    }

    // dS^T (a warp's 16 keys x Br queries) to shared memory, fp32; zeros where the warp's keys see
    // nothing of the step.
    static __device__ void store_score_gradients(const Shared& sh, const float (&dS)[Br / 8][4],
                                                 int warp, int lane) {
#pragma unroll
        for (int nt = 0; nt < Br / 8; ++nt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int key = 16 * warp + lane / 4 + 8 * r;
                *reinterpret_cast<float2*>(sh.dS + key * Cfg::kDSStride + 8 * nt + 2 * (lane % 4)) =
                    make_float2(dS[nt][2 * r], dS[nt][2 * r + 1]);
            }
    }

    // L15: dQ_i += scale dS K_j in 16-row x kDqCols-column pieces, one per warp. Per key
    // k-step of 8, keys 2t and 2t + 1 play k = t and k = t + 4 (cuda/ptx/tf32_mma.cuh's
    // renumbering): A = dS^T rows 2t, 2t + 1 at queries g, g + 8; B = K_j rows 2t, 2t + 1 at column
    // g.
    static __device__ void accumulate_dq(const BackwardParams& params, float* dQ_head,
                                         const Shared& sh, int row0, int warp, int lane) {
        constexpr int kNT = Cfg::kDqCols / 8;
        constexpr int kColPieces = D / Cfg::kDqCols;
        const int g = lane / 4, t = lane % 4;
        const int seq_q = int(params.problem.seq_q), d = int(params.problem.dim);
        const int rt = warp / kColPieces, col0 = (warp % kColPieces) * Cfg::kDqCols;
        if (row0 + 16 * rt >= seq_q || col0 >= d) return;
        float acc[kNT][4] = {};
#pragma unroll 2
        for (int ks = 0; ks < Bc / 8; ++ks) {
            const float* a0 = sh.dS + (8 * ks + 2 * t) * Cfg::kDSStride + 16 * rt + g;
            const float* a1 = a0 + Cfg::kDSStride;  // key 8 ks + 2t + 1
            const tf32::Split a[4] = {tf32::split(a0[0]), tf32::split(a0[8]),
                                      tf32::split(a1[0]), tf32::split(a1[8])};
            const float* k0 = sh.K + (8 * ks + 2 * t) * Cfg::kStride + col0 + g;
            const float* k1 = k0 + Cfg::kStride;
            tf32::Split bk[kNT][2];
#pragma unroll
            for (int n = 0; n < kNT; ++n)
                bk[n][0] = tf32::split(k0[8 * n]), bk[n][1] = tf32::split(k1[8 * n]);
            float part[kNT][4] = {};
            tf32::mma_3xtf32<kNT>(part, a, bk);
#pragma unroll
            for (int n = 0; n < kNT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[n][e] += part[n][e];
        }
        add_dq_piece<kNT>(params, dQ_head, acc, row0 + 16 * rt, col0, lane);
    }
};

}  // namespace flashattn::cuda
