// cuda/fa2/backward_ffma.cuh — cuda-fa2's backward kernels (FlashAttention-2's backward, arXiv
// 2307.08691 Algorithm 2, in float32 FFMA; host side in cuda/fa2/backward.cu).
//
// The rule is common/backward.hpp's. Three kernels, no atomics, the same bits on every run:
//   1. delta_kernel          D_i = rowsum(dO_i o O_i), a warp (or 8 lanes) per query row
//                            (Algorithm 2, line 4; cuda/stages/backward_prepass.cuh, shared with
//                            cuda-tc).
//   2. key_gradients_kernel  one block per (K/V tile j, batch, K/V head): K_j, V_j stay in shared
//      memory with the dK_j, dV_j accumulators while every visible query tile of the group's
//      query heads streams past (lines 6-18 without line 15's dQ update).
//   3. query_gradient_kernel one block per (query tile i, batch, head): Q_i, dO_i and the dQ_i
//      accumulator stay while every visible K/V tile streams past; it recomputes S_ij and dP_ij
//      (two more products per tile pair) instead of adding dQ_i with atomics, which
//      FlashAttention-2 does and which would make the sums' order, and so the bits, change from run
//      to run.
// In both, one step computes P_ij and dS_ij into shared memory (tile_scores), then each thread
// adds the products for the output elements it owns, in a fixed order. A masked pair is absent
// from every sum: P and dS are 0 there and, on a partly visible tile, skipped in the products
// (0 times a NaN in Q, K or dO would be NaN).
//
// Shared memory rows of Q, K, V, dO have an odd length (d | 1): the threads of a warp that read
// one column of different rows then hit different banks.
#pragma once

#include <cstdint>

#include "common/array_layout.hpp"
#include "common/backward.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"

namespace flashattn::cuda::fa2_backward {

struct Params {
    AttentionProblem p;  // block_mask.data on the device
    const float *Q, *K, *V, *O, *dO, *lse;
    float* D;  // B H N_q floats, written by delta_kernel
    float *dQ, *dK, *dV;
    KernelGate gate;  // closed where the device entry's finiteness test chose the tensor cores
    // Where the rows of Q, K, V, dO and of the gradients lie (resolved layouts).
    QkvLayouts in;
    ArrayLayout do_layout, dq_layout, dk_layout, dv_layout;
};

template <int kBr, int kBc, int kThreads>
struct Tile {
    static constexpr int Br = kBr, Bc = kBc, threads = kThreads;
    // Floats of shared memory for head dimension d: Q_i, dO_i, K_j, V_j (rows of d | 1), P_ij and
    // dS_ij (rows of Bc + 1), L_i and D_i, and the accumulators: dK_j and dV_j (Bc rows of d
    // each), or dQ_i (Br <= 2 Bc rows) in the same place.
    static_assert(Br <= 2 * Bc, "dQ_i's accumulator takes the place of dK_j and dV_j");
    static std::int64_t smem_floats(std::int64_t d) {
        const std::int64_t dp = d | 1;
        return 2 * Br * dp + 2 * Bc * dp + 2 * Br * (Bc + 1) + 2 * Br + 2 * Bc * d;
    }
};

// The shared-memory pieces of one block, carved from dynamic shared memory.
template <class T>
struct Smem {
    float *Q, *dO, *K, *V, *P, *dS, *L, *D, *acc0, *acc1;
    int dp;  // row length of Q, dO, K, V
    __device__ Smem(float* base, int d) : dp(d | 1) {
        Q = base, dO = Q + T::Br * dp, K = dO + T::Br * dp, V = K + T::Bc * dp;
        P = V + T::Bc * dp, dS = P + T::Br * (T::Bc + 1), L = dS + T::Br * (T::Bc + 1);
        D = L + T::Br, acc0 = D + T::Br, acc1 = acc0 + T::Bc * d;
    }
};

// Rows [rows) of X (N x d, global, rows `ld` floats apart) into shared rows of dp floats; rows
// past the end are 0.
template <class T>
__device__ void load_rows(const float* X, std::int64_t ld, TileRange rows, int n_rows, int d,
                          int dp, float* out) {
    for (int e = threadIdx.x; e < n_rows * d; e += T::threads) {
        const int r = e / d, k = e % d;
        out[r * dp + k] = r < rows.size() ? X[(rows.begin + r) * ld + k] : 0.0f;
    }
}

// Q_i, dO_i, L_i and D_i of query tile `rows` of head (b, h) into shared memory.
template <class T>
__device__ void load_query_tile(const Params& a, const Smem<T>& s, TileRange rows, std::int64_t b,
                                std::int64_t h, int d) {
    const AttentionProblem& p = a.p;
    load_rows<T>(a.Q + a.in.q.offset(b, h), a.in.q.row, rows, T::Br, d, s.dp, s.Q);
    load_rows<T>(a.dO + a.do_layout.offset(b, h), a.do_layout.row, rows, T::Br, d, s.dp, s.dO);
    for (int r = threadIdx.x; r < T::Br; r += T::threads) {
        const bool valid = r < rows.size();
        s.L[r] = valid ? a.lse[p.lse_offset(b, h) + rows.begin + r] : -INFINITY;
        s.D[r] = valid ? a.D[p.lse_offset(b, h) + rows.begin + r] : 0.0f;
    }
}

// P_ij and dS_ij of the loaded tiles, masked pairs 0 (the rule of common/backward.hpp).
template <class T>
__device__ void tile_scores(const AttentionProblem& p, const Smem<T>& s, TileRange rows,
                            TileRange cols, int d) {
    const float scale = p.softmax_scale();
    for (int e = threadIdx.x; e < T::Br * T::Bc; e += T::threads) {
        const int r = e / T::Bc, c = e % T::Bc;
        float P = 0.0f, dS = 0.0f;
        if (r < rows.size() && c < cols.size() && p.key_visible(rows.begin + r, cols.begin + c)) {
            // In double: one float chain of up to 256 products loses ~sqrt(d) ulps, and P =
            // exp(S - L) passes S's error on undamped (the forward's L came from its own sums).
            double qk = 0.0, dp = 0.0;
            for (int k = 0; k < d; ++k) {
                qk = fma(double(s.Q[r * s.dp + k]), double(s.K[c * s.dp + k]), qk);
                dp = fma(double(s.dO[r * s.dp + k]), double(s.V[c * s.dp + k]), dp);
            }
            P = recomputed_probability(scale * float(qk), s.L[r]);
            dS = score_gradient(P, float(dp), s.D[r]);
        }
        s.P[r * (T::Bc + 1) + c] = P;
        s.dS[r * (T::Bc + 1) + c] = dS;
    }
}

template <class T>
__global__ void __launch_bounds__(T::threads) key_gradients_kernel(const Params a) {
    if (a.gate.closed()) return;
    extern __shared__ float smem[];
    const AttentionProblem& p = a.p;
    const int d = static_cast<int>(p.dim);
    const Smem<T> s(smem, d);
    const std::int64_t Tr = tile_count(p.seq_q, T::Br);
    const TileRange cols = tile_range(blockIdx.x, T::Bc, p.seq_kv);
    const std::int64_t bg = blockIdx.y, b = bg / p.heads_kv, g = bg % p.heads_kv;
    const std::int64_t G = p.group_size();
    load_rows<T>(a.K + a.in.k.offset(b, g), a.in.k.row, cols, T::Bc, d, s.dp, s.K);
    load_rows<T>(a.V + a.in.v.offset(b, g), a.in.v.row, cols, T::Bc, d, s.dp, s.V);
    for (int e = threadIdx.x; e < T::Bc * d; e += T::threads) s.acc0[e] = 0.0f, s.acc1[e] = 0.0f;
    for (std::int64_t h = g * G; h < (g + 1) * G; ++h)
        for (std::int64_t i = next_visible_tile(p, TileAxis::queries, cols, 0, Tr, T::Br); i < Tr;
             i = next_visible_tile(p, TileAxis::queries, cols, i + 1, Tr, T::Br)) {
            const TileRange rows = tile_range(i, T::Br, p.seq_q);
            __syncthreads();  // the previous step's P, dS, Q_i, dO_i are no longer read
            load_query_tile<T>(a, s, rows, b, h, d);
            __syncthreads();
            tile_scores<T>(p, s, rows, cols, d);
            __syncthreads();
            const bool partial = classify_tile(p, rows, cols) == TileVisibility::partial;
            // dV_j += P^T dO_i, dK_j += dS^T Q_i (dK_j unscaled until the end). Each tile's sum
            // starts fresh and is then added: one float chain over every query row would drift.
            for (int e = threadIdx.x; e < cols.size() * d; e += T::threads) {
                const int c = e / d, k = e % d;
                float dv = 0.0f, dk = 0.0f;
                for (int r = 0; r < rows.size(); ++r) {
                    if (partial && !p.key_visible(rows.begin + r, cols.begin + c)) continue;
                    dv = fmaf(s.P[r * (T::Bc + 1) + c], s.dO[r * s.dp + k], dv);
                    dk = fmaf(s.dS[r * (T::Bc + 1) + c], s.Q[r * s.dp + k], dk);
                }
                s.acc1[c * d + k] += dv, s.acc0[c * d + k] += dk;
            }
        }
    __syncthreads();
    const float scale = p.softmax_scale();
    float* dK = a.dK + a.dk_layout.offset(b, g) + cols.begin * a.dk_layout.row;
    float* dV = a.dV + a.dv_layout.offset(b, g) + cols.begin * a.dv_layout.row;
    for (int e = threadIdx.x; e < cols.size() * d; e += T::threads) {
        const int c = e / d, k = e % d;
        dK[c * a.dk_layout.row + k] = scale * s.acc0[e];
        dV[c * a.dv_layout.row + k] = s.acc1[e];
    }
}

template <class T>
__global__ void __launch_bounds__(T::threads) query_gradient_kernel(const Params a) {
    if (a.gate.closed()) return;
    extern __shared__ float smem[];
    const AttentionProblem& p = a.p;
    const int d = static_cast<int>(p.dim);
    const Smem<T> s(smem, d);
    const std::int64_t Tc = tile_count(p.seq_kv, T::Bc);
    const TileRange rows = tile_range(blockIdx.x, T::Br, p.seq_q);
    const std::int64_t bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
    load_query_tile<T>(a, s, rows, b, h, d);
    for (int e = threadIdx.x; e < T::Br * d; e += T::threads) s.acc0[e] = 0.0f;
    for (std::int64_t j = next_visible_tile(p, TileAxis::keys, rows, 0, Tc, T::Bc); j < Tc;
         j = next_visible_tile(p, TileAxis::keys, rows, j + 1, Tc, T::Bc)) {
        const TileRange cols = tile_range(j, T::Bc, p.seq_kv);
        __syncthreads();  // the previous step's K_j, V_j, dS are no longer read
        const std::int64_t g = p.kv_head(h);
        load_rows<T>(a.K + a.in.k.offset(b, g), a.in.k.row, cols, T::Bc, d, s.dp, s.K);
        load_rows<T>(a.V + a.in.v.offset(b, g), a.in.v.row, cols, T::Bc, d, s.dp, s.V);
        __syncthreads();
        tile_scores<T>(p, s, rows, cols, d);
        __syncthreads();
        const bool partial = classify_tile(p, rows, cols) == TileVisibility::partial;
        // dQ_i += dS K_j (unscaled until the end).
        for (int e = threadIdx.x; e < rows.size() * d; e += T::threads) {
            const int r = e / d, k = e % d;
            float dq = 0.0f;  // this tile's sum, then added (see above)
            for (int c = 0; c < cols.size(); ++c) {
                if (partial && !p.key_visible(rows.begin + r, cols.begin + c)) continue;
                dq = fmaf(s.dS[r * (T::Bc + 1) + c], s.K[c * s.dp + k], dq);
            }
            s.acc0[r * d + k] += dq;
        }
    }
    __syncthreads();
    const float scale = p.softmax_scale();
    float* dQ = a.dQ + a.dq_layout.offset(b, h) + rows.begin * a.dq_layout.row;
    for (int e = threadIdx.x; e < rows.size() * d; e += T::threads)
        dQ[(e / d) * a.dq_layout.row + e % d] = scale * s.acc0[e];
}

}  // namespace flashattn::cuda::fa2_backward
