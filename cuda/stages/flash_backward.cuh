// cuda/stages/flash_backward.cuh — FlashAttention-2's backward on tensor cores, written once for
// both
// precisions: the loop, the masks, P and dS, the dQ order and the final writes. What differs by
// precision (how tiles are stored and multiplied) is an `Ops` type:
//   * cuda-tc (fp16 / bf16 on mma.sync m16n8k16): TcBackwardOps, cuda/tc/backward_ops.cuh;
//   * cuda-fa2 (fp32 as 3xTF32 on mma.sync m16n8k8): Tf32BackwardOps, cuda/fa2/backward_tf32.cuh.
// Host sides: cuda/tc/backward.cu and cuda/fa2/backward.cu.
//
// FlashAttention-2, Algorithm 2 (backward; Dao 2023, arXiv 2307.08691), and where each line lives.
// The rule (P from L, D = rowsum(dO o O), dS = P o (dP - D)) is common/backward.hpp's.
//
//   L3    dQ = 0 in HBM (a float32 sum)       cuda-tc: delta_kernel, in the same pass as L4;
//                                              cuda-fa2: a memset after it
//   L4    D_i = rowsum(dO_i o O_i)             delta_kernel (cuda/stages/backward_prepass.cuh), first
//   L5    for 1 <= j <= Tc                     one CTA per (j, b, K/V head)
//   L6      load K_j, V_j to SRAM              Ops::load_keys (cp.async)
//   L7      dK_j = 0, dV_j = 0                 registers
//   L8      for 1 <= i <= Tr                   the step loop (every query head of the GQA group)
//   L9        load Q_i, dO_i, L_i, D_i         Ops::load_query_step (cp.async ring of 2)
//   L10       S_ij = Q_i K_j^T                 Ops::scores, as S^T = K_j Q_i^T
//   L11       P_ij = exp(S_ij - L_i)           probabilities_and_score_gradients (+ masks)
//   L12       dV_j += P_ij^T dO_i              Ops::accumulate_dv
//   L13       dP_ij = dO_i V_j^T               Ops::output_scores, as dP^T = V_j dO_i^T
//   L14       dS_ij = P_ij o (dP_ij - D_i)     probabilities_and_score_gradients
//   L15       dQ_i += dS_ij K_j                Ops::accumulate_dq, added to HBM with atomics
//   L16       dK_j += dS_ij^T Q_i              Ops::accumulate_dk
//   L18   write dK_j, dV_j                     write_key_gradients
//
// How the work is laid out, and why:
//
//  * Transposed tiles. Each warp owns 16 keys of K_j (Bc = 16 warps) and computes S^T = K_j Q_i^T
//    and dP^T = V_j dO_i^T for them: the m16n8 accumulators then hold rows = keys, which is what
//    dV_j += P^T dO_i and dK_j += dS^T Q_i need as their A operand. As in the forward's P~ V
//    product, the fp32 accumulators of P^T and dS^T are already A fragments (for 16-bit inputs
//    once rounded; for tf32 under a renumbering of k), with no trip through shared memory; so the
//    forward's own product stages serve here, on views that name which tile plays which role.
//  * dK_j and dV_j stay in registers for the whole loop; every query tile of every query head of
//    the GQA group streams past, so the group's sum is formed in place and written once.
//  * dQ_i needs a sum over all keys of the tile, across warps: dS^T goes to shared memory, and the
//    warps then split dQ_i = dS K_j into 16-row pieces and add them to dQ in HBM with fp32 atomics
//    (FlashAttention-2's choice). The order of those additions varies from run to run, and so may
//    dQ's last bits. kDeterministic makes the order fixed: the CTAs of one query tile add in the
//    order of their key tiles, each waiting for its turn on a counter (FlashAttention-3's
//    deterministic mode does the same). docs/cuda_backward.md measures both.
//  * Masks as in the forward: per warp, classify_tile says whether its 16 keys x Br queries are
//    fully visible (no test), partly (P = dS = 0 where hidden) or not at all (skipped). A key tile
//    visits only the query tiles that can see it (next_visible_tile), so under a causal mask the
//    loop starts at the diagonal. In a partly visible tile each key's visible queries are a suffix
//    ending at N_q (first_causal_row): two bounds per key, not a 64-bit test per entry.
//  * Ragged tails: the copies zero-fill rows past N_q and N_kv (and columns past d), and such a
//    tile is masked as a partial one, so padding rows add nothing (P = 0, not exp(0 - L)).
//  * A masked pair is left out where it can be: P = dS = 0. Inside a partly visible tile it still
//    enters the tensor-core products as 0 times its dO_i or Q_i row, so an inf or NaN in an input
//    reaches, besides the gradients that read it, the others of its 16-key tile. cuda-tc's tests
//    check that contract; cuda-fa2 runs this kernel for finite inputs only (its FFMA kernels skip
//    masked pairs exactly).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/backward.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"
#include "cuda/stages/async_copy.cuh"
#include "cuda/stages/mma_stages.cuh"

namespace flashattn::cuda {

// Everything the kernel reads; passed by value.
struct BackwardParams {
    const void* Q;     // (B, H, N_q, d): 16-bit values times q_sign (cuda-tc), or float
    const void* K;     // (B, H_kv, N_kv, d)
    const void* V;     // (B, H_kv, N_kv, d)
    const void* dO;    // (B, H, N_q, d), of Q's type
    const float* lse;  // (B, H, N_q): the forward's L
    const float* D;    // (B, H, N_q): rowsum(dO o O), from delta_kernel
    float* dQ;         // (B, H, N_q, d) float32 at dq_layout, zero before the launch: added to
    void* dK;          // (B, H_kv, N_kv, d) at dk_layout, of grad_dtype: written once
    void* dV;          // at dv_layout
    int* dq_turns;  // kDeterministic: (B, H, Tr) counters, zero before the launch
    AttentionProblem problem;  // its block_mask.data (if any) points to device memory
    float scale_log2;          // c = |scale| log2(e), as the forward's
    float scale;               // the signed softmax scale: dQ = scale dS K
    float abs_scale;           // |scale|
    KernelGate gate;           // cuda-fa2's device entry: closed where its FFMA kernels run instead
    // Where dK's and dV's rows lie and their type: contiguous float32 (make_backward_params)
    // unless cuda-fa3's device entry says otherwise (DeviceBackward).
    ArrayLayout dk_layout = {}, dv_layout = {};
    DType grad_dtype = DType::f32;
    // Where Q's, K's, V's and dO's rows lie, and dQ's (resolved): contiguous
    // (make_backward_params) unless cuda-fa2's device entry reads and writes its caller's views in
    // place (Backend::device_layouts).
    QkvLayouts in = {};
    ArrayLayout do_layout = {}, dq_layout = {};
};

inline BackwardParams make_backward_params(const AttentionProblem& p, const void* Q, const void* K,
                                           const void* V, const void* dO, const float* lse,
                                           const float* D, float* dQ, void* dK, void* dV,
                                           int* dq_turns) {
    const float abs_scale = std::fabs(p.softmax_scale());
    BackwardParams params{Q, K, V, dO, lse, D, dQ, dK, dV, dq_turns, p,
                          abs_scale > 0 ? abs_scale * kLog2e : 1e-30f, p.softmax_scale(), abs_scale,
                          KernelGate{}};
    params.dk_layout = params.dv_layout = ArrayLayout::contiguous(p.heads_kv, p.seq_kv, p.dim);
    params.in = QkvLayouts::contiguous(p);
    params.do_layout = params.dq_layout = params.in.q;
    return params;
}

// Algorithm 2 L9 (the statistics): L_i and D_i of query tile i, head h, into shared memory, by
// kThreads threads (this one is `thread` of them); rows past N_q read as 0 (never used: they are
// masked). kAsync: by cp.async, committed and waited for by the caller; else by plain loads and
// stores, done when the function returns (cuda-fa3's producer warp, which then signals them).
template <int Br, int kThreads, bool kAsync = true>
__device__ __forceinline__ void load_row_statistics(const BackwardParams& params, std::int64_t b,
                                                    std::int64_t h, int i, float* sL, float* sD,
                                                    int thread = int(threadIdx.x)) {
    const AttentionProblem& p = params.problem;
    for (int r = thread; r < Br; r += kThreads) {
        const int row = i * Br + r;
        const bool valid = row < p.seq_q;
        const std::int64_t at = p.lse_offset(b, h) + (valid ? row : 0);
        if constexpr (kAsync) {
            cp_async_4(sL + r, params.lse + at, valid);
            cp_async_4(sD + r, params.D + at, valid);
        } else {
            sL[r] = valid ? params.lse[at] : 0.0f;
            sD[r] = valid ? params.D[at] : 0.0f;
        }
    }
}

// Two floats from shared memory, loaded where the code reads them: a volatile load keeps its
// place among the kernel's other volatile instructions (cuda-fa3's waits for its products).
__device__ __forceinline__ float2 load_shared_float2_in_order(const float* at) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(static_cast<unsigned>(__cvta_generic_to_shared(at)))
                 : "memory");
    return v;
}

// Which entries of a tile probabilities_and_score_gradients sets to P = dS = 0.
enum class ScoreMask {
    none,  // every entry is visible
    // The rows of keys past N_kv only: a ragged key tile without a causal or block mask. Its query
    // columns past N_q need no mask: their L_i, D_i and (zero-filled) Q_i, dO_i rows are 0, so P
    // = 2^0 = 1 and dS = 0 there, and the P^T dO_i they add to dV_j is 0. The keys past N_kv do:
    // their zero K_j rows give S = 0 and P = e^(-L_i), which overflows where L_i < -88.
    keys_past_end,
    visible,  // every entry by the mask: causal, block mask, both edges of a ragged tile
};

// Algorithm 2 L11 and L14 on a warp's S^T and dP^T accumulators (Br query columns), in place: S
// becomes P^T and dP becomes dS^T. Entry (nt, e) is key key0 + lane / 4 + 8 (e / 2), query row0 +
// 8 nt + 2 (lane % 4) + e % 2. kMask (ScoreMask) says which pairs are hidden: they get P = dS =
// 0. kExact: P = exp(|scale| s - L) in full precision (the fp32 kernel, held to fp32's accuracy);
// otherwise the exp2 form with the shift taken once per row (fp16/bf16).
// kStatisticsInOrder: each pair of L_i and D_i values is loaded where it is used. With plain loads
// ptxas moves all of them (Br / 2 floats per thread) above cuda-fa3's wait for S^T and dP^T, where
// those accumulators are live too, and spills more (docs/cuda_fa3.md measures it); in cuda-tc's
// mma.sync kernels the plain loads spill less.
template <int Br, bool kBlockMask, ScoreMask kMask, bool kExact, bool kStatisticsInOrder = false>
__device__ __forceinline__ void probabilities_and_score_gradients(
    float (&S)[Br / 8][4], float (&dP)[Br / 8][4], const float* sL, const float* sD,
    const BackwardParams& params, int row0, int key0, int lane) {
    const AttentionProblem& p = params.problem;
    // Without a block mask a key's visible queries are a suffix of the rows that ends at N_q
    // (first_causal_row), so a masked tile needs two bounds per key: entry (nt, e) is visible iff
    // first[e / 2] <= 8 nt + e % 2 < end, counted from the thread's first query row0 +
    // 2 (lane % 4) and clamped to [0, Br]. The per-entry test is then two 32-bit compares with
    // constants, where one in 64 bits per entry took several integer instructions each (the
    // forward's mask_scores does the same by rows).
    constexpr bool kMasked = kMask == ScoreMask::visible;
    int first[2] = {0, 0}, end = Br;
    bool key_in[2] = {true, true};  // ScoreMask::keys_past_end: one test per row, not per entry
    if constexpr (kMask == ScoreMask::keys_past_end) {
        static_assert(!kBlockMask, "keys_past_end: a tile without a block mask");
#pragma unroll
        for (int r = 0; r < 2; ++r) key_in[r] = std::int64_t(key0) + lane / 4 + 8 * r < p.seq_kv;
    }
    if constexpr (kMasked && !kBlockMask) {
        const std::int64_t q0 = std::int64_t(row0) + 2 * (lane % 4);
        const auto clamp = [](std::int64_t v) { return int(v < 0 ? 0 : (v > Br ? Br : v)); };
        end = clamp(p.seq_q - q0);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const std::int64_t key = std::int64_t(key0) + lane / 4 + 8 * r;
            first[r] = key < p.seq_kv ? clamp(p.first_causal_row(key) - q0) : Br;
        }
    }
#pragma unroll
    for (int nt = 0; nt < Br / 8; ++nt) {
        const int q = 8 * nt + 2 * (lane % 4);
        const float2 L = kStatisticsInOrder ? load_shared_float2_in_order(sL + q)
                                            : *reinterpret_cast<const float2*>(sL + q);
        const float2 D = kStatisticsInOrder ? load_shared_float2_in_order(sD + q)
                                            : *reinterpret_cast<const float2*>(sD + q);
        const float lse[2] = {L.x, L.y};
        const float shift[2] = {lse_shift(L.x), lse_shift(L.y)};
        const float delta[2] = {D.x, D.y};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float P = kExact ? recomputed_probability(params.abs_scale * S[nt][e], lse[e % 2])
                             : recomputed_probability_exp2(S[nt][e], shift[e % 2], params.scale_log2);
            float dS = score_gradient(P, dP[nt][e], delta[e % 2]);
            if constexpr (kMasked) {
                bool visible;
                if constexpr (kBlockMask) {
                    const int row = row0 + q + e % 2;
                    const int key = key0 + lane / 4 + 8 * (e / 2);
                    visible = row < p.seq_q && key < p.seq_kv && p.key_visible(row, key);
                } else {
                    const int c = 8 * nt + e % 2;
                    visible = c >= first[e / 2] && c < end;
                }
                if (!visible) P = 0.0f, dS = 0.0f;
            }
            if constexpr (kMask == ScoreMask::keys_past_end)
                if (!key_in[e / 2]) P = 0.0f, dS = 0.0f;
            S[nt][e] = P;
            dP[nt][e] = dS;
        }
    }
}

// The turn of key tile j on query tile `rows`: how many key tiles before j add to the same dQ_i.
// Without a block mask the key tiles a query tile sees are a prefix (0 .. its diagonal), so it is
// j; with one, the visible tiles before j are counted.
template <bool kBlockMask>
__device__ __forceinline__ int dq_turn(const AttentionProblem& p, TileRange rows, int j, int Bc) {
    if constexpr (!kBlockMask) return j;
    int turn = 0;
    for (std::int64_t t = next_visible_tile(p, TileAxis::keys, rows, 0, j, Bc); t < j;
         t = next_visible_tile(p, TileAxis::keys, rows, t + 1, j, Bc))
        ++turn;
    return turn;
}

// Algorithm 2 L8's order for key tile `cols`: the steps are (h, i) for every query head h0 ..
// h0 + G - 1 of the K/V head's group and every query tile i that can see the keys. Moves (h, i)
// to the step after it (start from h = h0, i = -1); h = h0 + G when none is left. Head: the type
// of the head indices (cuda-fa3 keeps them in 32 bits, for registers).
template <class Head>
__device__ __forceinline__ void next_step(const AttentionProblem& p, TileRange cols, int Tr, int Br,
                                          Head h0, Head G, Head& h, int& i) {
    i = int(next_visible_tile(p, TileAxis::queries, cols, i + 1, Tr, Br));
    while (i >= Tr && ++h < h0 + G) i = int(next_visible_tile(p, TileAxis::queries, cols, 0, Tr, Br));
}

// Deterministic mode's fixed order of dQ additions: the CTA of key tile j waits (thread 0 spins,
// then the whole CTA meets) until the key tiles before it have added to dQ_i of query tile i, head
// h; returns the counter that pass_dq_turn advances once this CTA's additions are done.
template <bool kBlockMask>
__device__ __forceinline__ int* wait_dq_turn(const BackwardParams& params, std::int64_t b,
                                             std::int64_t h, int Tr, int i, TileRange rows, int j,
                                             int Bc) {
    const AttentionProblem& p = params.problem;
    int* turn = params.dq_turns + (b * p.heads + h) * Tr + i;
    if (threadIdx.x == 0) {
        const int mine = dq_turn<kBlockMask>(p, rows, j, Bc);
        while (*static_cast<volatile int*>(turn) != mine) {
        }
        __threadfence();
    }
    __syncthreads();
    return turn;
}
__device__ __forceinline__ void pass_dq_turn(int* turn) {
    __threadfence();  // this tile's additions are done before the next tile's turn
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(turn, 1);
}

// dQ_i += scale acc for one 16-row piece (accumulator columns col0 .. col0 + 8 kNT - 1): fp32
// atomics, two floats at a time where the row is whole; rows past N_q and columns past d are not
// written.
template <int kNT>
__device__ __forceinline__ void add_dq_piece(const BackwardParams& params, float* dQ_head,
                                             const float (&acc)[kNT][4], int row0, int col0,
                                             int lane) {
    const AttentionProblem& p = params.problem;
    const int d = int(p.dim);
    const std::int64_t ld = params.dq_layout.row;
    // Pairs where both values' addresses are 8-byte aligned: even d and even strides (a strided
    // dQ's are, as its device entry checks: require_output_layout).
    const bool pairs = d % 2 == 0 && ld % 2 == 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + lane / 4 + 8 * r;
        if (row >= p.seq_q) continue;
        float* out = dQ_head + std::int64_t(row) * ld + col0 + 2 * (lane % 4);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            const int col = col0 + 8 * nt + 2 * (lane % 4);
            const float x = params.scale * acc[nt][2 * r], y = params.scale * acc[nt][2 * r + 1];
#if __CUDA_ARCH__ >= 900
            if (pairs && col + 1 < d) {
                atomicAdd(reinterpret_cast<float2*>(out + 8 * nt), make_float2(x, y));
                continue;
            }
#endif
            if (col < d) atomicAdd(out + 8 * nt, x);
            if (col + 1 < d) atomicAdd(out + 8 * nt + 1, y);
        }
    }
}

// Algorithm 2 L18: dK_j = dk_scale sum dS^T Q, dV_j of K/V head g, batch entry b, where
// params.dk_layout and dv_layout put them, in params.grad_dtype: the D columns col0 .. col0 + D - 1
// that the caller holds (all of them but in cuda-fa3 at d = 256, whose warpgroups hold 128 each);
// rows past N_kv and columns past d are not written.
template <int D>
__device__ __forceinline__ void write_key_gradients(const BackwardParams& params,
                                                    const float (&dK)[D / 8][4],
                                                    const float (&dV)[D / 8][4], float dk_scale,
                                                    std::int64_t b, std::int64_t g, int key0,
                                                    int lane, int col0 = 0) {
    const AttentionProblem& p = params.problem;
    const int d = int(p.dim);
    const DType t = params.grad_dtype;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = key0 + lane / 4 + 8 * r;
        if (key >= p.seq_kv) continue;
        const std::int64_t dK_row = params.dk_layout.offset(b, g) +
                                    std::int64_t(key) * params.dk_layout.row + col0 + 2 * (lane % 4);
        const std::int64_t dV_row = params.dv_layout.offset(b, g) +
                                    std::int64_t(key) * params.dv_layout.row + col0 + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            if (d == D || (d % 2 == 0 && col0 + D <= d)) {  // all D columns inside d
                mma::store_output_pair(params.dK, t, dK_row + 8 * dt, dk_scale * dK[dt][2 * r],
                                       dk_scale * dK[dt][2 * r + 1]);
                mma::store_output_pair(params.dV, t, dV_row + 8 * dt, dV[dt][2 * r],
                                       dV[dt][2 * r + 1]);
            } else {  // padded d (possibly odd: no paired stores)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (col0 + 8 * dt + 2 * (lane % 4) + e < d) {
                        mma::store_output(params.dK, t, dK_row + 8 * dt + e,
                                          dk_scale * dK[dt][2 * r + e]);
                        mma::store_output(params.dV, t, dV_row + 8 * dt + e, dV[dt][2 * r + e]);
                    }
            }
        }
    }
}

// ---- the kernel ------------------------------------------------------------------------------
// Grid: (Tc, batch x K/V heads); block: Ops::kThreads; dynamic shared memory: Ops::kSmemBytes.
// Key tile 0 sees the most query tiles under a causal mask and is launched first.
template <class Ops, bool kBlockMask, bool kDeterministic>
__global__ void __launch_bounds__(Ops::kThreads) backward_kernel(const BackwardParams params) {
    if (params.gate.closed()) return;
    constexpr int Br = Ops::Br, Bc = Ops::Bc, D = Ops::D;
    extern __shared__ float4 smem_base[];
    const typename Ops::Shared sh(smem_base);

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
    // L6: K_j, V_j of head g (cp.async group 0, with the first step's tiles).
    Ops::load_keys(params, sh, b, g, j);

    // L8: the steps (h, i), in next_step's order.
    std::int64_t h = h0;
    int i = -1;
    next_step(p, cols, Tr, Br, h0, G, h, i);
    if (h < h0 + G) Ops::load_query_step(params, sh, 0, b, h, i);
    cp_async_commit();

    // L7: dK_j = 0, dV_j = 0, in this warp's registers (its 16 keys x D).
    float dK[D / 8][4], dV[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dK[dt][e] = dV[dt][e] = 0.0f;

    typename Ops::KeyFragments frags;
    int slot = 0;
    bool first = true;
    while (h < h0 + G) {
        std::int64_t h_next = h;
        int i_next = i;
        next_step(p, cols, Tr, Br, h0, G, h_next, i_next);
        // This step's tiles have landed, and every warp is done with the previous step (its slot,
        // which the next copy overwrites, and dS^T, which this step rewrites).
        cp_async_wait_all();
        __syncthreads();
        if (h_next < h0 + G) Ops::load_query_step(params, sh, slot ^ 1, b, h_next, i_next);
        cp_async_commit();
        if (first) frags.load(sh, warp, lane);  // K_j, V_j fragments, where kept in registers
        first = false;

        const TileRange rows = {i * Br, min(i * Br + Br, seq_q)};
        const TileVisibility seen = warp_cols.size() > 0
                                        ? mma::visibility<kBlockMask>(p, rows, warp_cols)
                                        : TileVisibility::none;
        float S[Br / 8][4], dP[Br / 8][4];
        if (seen != TileVisibility::none) {
            Ops::scores(S, frags, sh, slot, params, warp, lane);  // L10: S^T = K_j Q_i^T
            Ops::output_scores(dP, frags, sh, slot, warp, lane);  // L13: dP^T = V_j dO_i^T
            if (seen == TileVisibility::partial || rows.size() < Br || warp_cols.size() < 16)
                probabilities_and_score_gradients<Br, kBlockMask, ScoreMask::visible,
                                                  Ops::kExactExp>(S, dP, sh.L(slot), sh.Delta(slot),
                                                                  params, rows.begin, key0, lane);
            else
                probabilities_and_score_gradients<Br, kBlockMask, ScoreMask::none, Ops::kExactExp>(
                    S, dP, sh.L(slot), sh.Delta(slot), params, rows.begin, key0, lane);
            Ops::accumulate_dv(dV, S, sh, slot, lane);  // L12: dV_j += P^T dO_i
            Ops::accumulate_dk(dK, dP, sh, slot, lane);  // L16: dK_j += dS^T Q_i (unscaled)
        } else {
#pragma unroll
            for (int nt = 0; nt < Br / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) dP[nt][e] = 0.0f;
        }
        Ops::store_score_gradients(sh, dP, warp, lane);
        __syncthreads();  // dS^T complete

        // L15: dQ_i += scale dS K_j; in kDeterministic mode after the key tiles before this one.
        int* turn = nullptr;
        if constexpr (kDeterministic) turn = wait_dq_turn<kBlockMask>(params, b, h, Tr, i, rows, j, Bc);
        Ops::accumulate_dq(params, params.dQ + params.dq_layout.offset(b, h), sh, rows.begin, warp,
                           lane);
        if constexpr (kDeterministic) pass_dq_turn(turn);
        h = h_next, i = i_next;
        slot ^= 1;
    }
    cp_async_wait_all();  // a CTA with no step still has K_j, V_j in flight

    // L18. dK's scale: |scale| where Q was read times q_sign (so S^T had the right sign), else the
    // signed scale.
    write_key_gradients<D>(params, dK, dV, Ops::kQSignFolded ? params.abs_scale : params.scale, b,
                           g, key0, lane);
}

}  // namespace flashattn::cuda
