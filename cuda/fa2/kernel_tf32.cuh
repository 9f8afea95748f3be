// cuda/fa2/kernel_tf32.cuh — cuda-fa2 v4: FlashAttention-2 in float32 with both products on tensor
// cores, by 3xTF32 (cuda/ptx/tf32_mma.cuh says why that is as accurate as fp32 FMAs).
//
// This is cuda-tc's kernel (cuda/tc/kernel.cuh: FA2 Algorithm 1, one CTA per query tile, warps
// owning 16-row tiles, O_i, m_i, l_i in registers in the mma accumulator layout) with fp32
// operands. The softmax, masking and output stages are cuda-tc's own functions, called
// unchanged: the accumulator layout of mma.m16n8k8.tf32 is that of m16n8k16. What differs:
//
//  * Operands are fp32 in shared memory and are split (big + small tf32) as they are read into
//    fragments; every product of 16 x 8 x 8 is three mma's.
//  * Q_i stays in shared memory and is re-read (and split) for every key tile: in registers it
//    would take d/2 of them raw or d split, beside O_i's d/2 -- measured with ptxas, that spilled
//    at d = 128 even with 255 registers.
//  * Each A fragment meets a row of B fragments pass by pass (tf32::mma_3xtf32<kN>): the three
//    products of one accumulator depend on each other, products of different ones do not.
//  * Fragment loads follow cuda/ptx/tf32_mma.cuh's k renumbering: for S = Q K^T a lane reads 4
//    consecutive floats of a K row (one 16-byte load) for two k-steps; for P V the S accumulators
//    are already the A fragments, and b0, b1 are V rows 8 nt + 2t and 8 nt + 2t + 1.
//  * Padded rows instead of swizzles: K_j and Q_i rows are D + 16 floats apart (the 8 lanes of a
//    16-byte load phase read 2 rows x 4 chunks: +16 floats puts the second row in the other
//    half of the banks), V_j rows D + 4 (lanes (g, t) read row 2t, column g: bank 8t + g, all 32
//    distinct).
//  * Accuracy: a tensor core adds the products of one mma to its accumulator with truncation
//    (round toward zero), not fp32's round to nearest, so the error of a chain of mma's into one
//    accumulator grows with its length, one-sided; long chains broke the tests' 2x rule. So every
//    k-step (8 columns of d for S, 8 keys for O) takes a fresh accumulator -- its three mma's,
//    small products first, truncate only a sum of 8 products -- and is added to S_ij or O_i with
//    an ordinary fp32 add (round to nearest), as Ootomo and Yokota's single-precision
//    tensor-core GEMM does (errors and cost: docs/cuda_fp32_notes.md, section
//    "cuda/fa2/kernel_tf32.cuh").
//  * Exponents as 2^((s - m) c), not 2^(s c - m c) (exp2_of_difference): at large logits the
//    second form moved weights by ~0.1% (measured: O error 2.4e-4 on the tests' |s| ~ 1e4 case).
//  * Inputs the split cannot carry: a NaN, an inf, and a finite value within half a tf32 unit of
//    FLT_MAX (cuda/ptx/tf32_mma.cuh: a NaN could vanish, an inf give NaN, and a masked key's
//    P = 0 times an inf V would be NaN where the FFMA kernel leaves masked keys out). Two ways to
//    keep them out, chosen by the host (cuda/fa2/backend.cu, by the problem's size):
//      - kInspect = false: the inputs were tested first (on the host, or on the device by one
//        more launch whose flags `gate` the two kernels queued behind it), and this kernel runs
//        only where they are finite.
//      - kInspect = true (small problems, where those launches cost more than the kernel): one
//        launch. The CTA tracks the largest |x| of everything it splits (a NaN kept): Q_i once as
//        it lands (Tf32ForwardOps::hold_q), K_j and V_j in registers as the products split them,
//        each value by one warp (SplitInspection). A query tile whose inputs hold such a value is
//        computed again by the FFMA kernel's code (fa2_forward_tile, cuda/fa2/kernel_ffma.cuh)
//        before anything is written. The looking costs the kernel 4-6% at large problems (a pass
//        over each tile in shared memory cost 6-13%: docs/cuda_fp32_notes.md, "One launch"),
//        more than the test does there; hence only where the launches cost more.
//
// The loop, the masks, the softmax and the epilogue are cuda/stages/flash_forward.cuh's (its header
// maps FA2 Algorithm 1 line by line), shared with cuda-tc; this file holds the fp32 operand
// stages, gathered in Tf32ForwardOps: L4 / L7 tf32_load_tile, L8 tf32_scores, L10 tf32_accumulate_pv.
// The host side that chooses the kernel: cuda/fa2/backend.cu.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/stages/async_copy.cuh"
#include "cuda/stages/warp_softmax.cuh"
#include "cuda/stages/flash_forward.cuh"
#include "cuda/stages/mma_stages.cuh"
#include "cuda/fa2/kernel_ffma.cuh"
#include "cuda/host/check.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/ptx/tf32_mma.cuh"

namespace flashattn::cuda {

// The compile-time shape of one CTA: kWarps warps of one 16-row tile each, key tiles of Bc rows,
// two ring slots (the copy of tile j + 1 runs while tile j is multiplied).
template <int D_, int kWarps_, int Bc_, int kMinBlocks_>
struct Tf32Tile {
    static constexpr int D = D_;  // padded head dim: 64 or 128
    static constexpr int kWarps = kWarps_;
    static constexpr int kMTiles = 1;  // what cuda/stages/mma_stages.cuh's stages expect
    static constexpr int kWarpRows = 16;
    static constexpr int Br = 16 * kWarps_;
    static constexpr int Bc = Bc_;
    static constexpr int kThreads = 32 * kWarps_;
    static constexpr int kStages = 2;  // the copy of tile j + 1 runs while tile j is multiplied
    static constexpr int kQKStride = D_ + 16;  // floats between rows of Q_i and K_j
    static constexpr int kVStride = D_ + 4;    // floats between rows of V_j
    static constexpr int kSlotFloats = Bc_ * (kQKStride + kVStride);  // K_j then V_j
    static constexpr int kSmemFloats = Br * kQKStride + 2 * kSlotFloats;  // Q_i, two ring slots
    static constexpr std::size_t SMEM_BYTES = std::size_t{kSmemFloats} * sizeof(float);
    static constexpr int THREADS = kThreads;
    static constexpr int MIN_BLOCKS = kMinBlocks_;  // CTAs per SM the registers must allow

    // The FFMA kernel's configuration that computes a query tile whose inputs the split cannot
    // carry (see the header): the same rows and threads, in this tile's shared memory.
    using Ffma = fa2::Fa2Config<D_, Br, 32, kThreads, kMinBlocks_>;

    static_assert(D_ % 32 == 0, "the bank arithmetic above assumes rows of a multiple of 32 floats");
    static_assert(Bc_ % 8 == 0, "key tiles are whole n8 / k8 tiles");
    static_assert(Ffma::SMEM_BYTES <= SMEM_BYTES, "the FFMA fallback must fit in this tile's memory");
};

// Which of the values a warp splits it also looks at, for a kernel that must know whether the
// split carried them all (tf32::split_carries). Every warp splits all of K_j and V_j, and one look
// at each value is enough: warp w looks at the k-step pairs qd of S (16 columns of K_j) and the key
// tiles nt of P V (8 rows of V_j) whose index % warps is w. NoInspection: the kernels whose inputs
// were tested before they run (the forward with kInspect = false, and cuda-fa2's backward).
struct NoInspection {
    __device__ __forceinline__ static NoInspection of_warp(int) { return {}; }
    __device__ __forceinline__ static constexpr bool takes(int) { return false; }
    __device__ __forceinline__ static void look(float) {}
};
template <int kWarps>
struct SplitInspection {
    float seen = 0.0f;  // the largest |x| looked at, NaN if one was NaN (tf32::largest_magnitude)
    int warp;
    __device__ __forceinline__ static SplitInspection of_warp(int w) { return {0.0f, w}; }
    __device__ __forceinline__ bool takes(int index) const { return index % kWarps == warp; }
    __device__ __forceinline__ void look(float x) { seen = tf32::largest_magnitude(seen, x); }
};

// FA2 L8: S = (q_sign Q_i) K_j^T (unscaled) for this warp's 16 rows (row 0 of sQ_w is the
// warp's first).
// For the k-step pair (2 qd, 2 qd + 1) a lane reads columns 16 qd + 4t .. + 3 of Q_i rows g and
// g + 8 (A values of step 2 qd: +0, +1; of step 2 qd + 1: +2, +3) and the same 4 columns of K_j
// row 8 nt + g (B values), each with one 16-byte load.
template <class Cfg, class Inspection = NoInspection>
__device__ __forceinline__ void tf32_scores(float (&S)[Cfg::Bc / 8][4], const float* sQ_w,
                                            float q_sign, const float* sK, int lane,
                                            Inspection&& inspection = {}) {
    constexpr int kNT = Cfg::Bc / 8;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] = 0.0f;
#pragma unroll 2
    for (int qd = 0; qd < Cfg::D / 16; ++qd) {
        float4 q0 = *reinterpret_cast<const float4*>(sQ_w + g * Cfg::kQKStride + 16 * qd + 4 * t);
        float4 q8 =
            *reinterpret_cast<const float4*>(sQ_w + (g + 8) * Cfg::kQKStride + 16 * qd + 4 * t);
        q0 = make_float4(q_sign * q0.x, q_sign * q0.y, q_sign * q0.z, q_sign * q0.w);
        q8 = make_float4(q_sign * q8.x, q_sign * q8.y, q_sign * q8.z, q_sign * q8.w);
        float4 k[kNT];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
            k[nt] = *reinterpret_cast<const float4*>(sK + (8 * nt + g) * Cfg::kQKStride +
                                                     16 * qd + 4 * t);
        if (inspection.takes(qd))
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) inspection.look(component(k[nt], c));
#pragma unroll
        for (int step = 0; step < 2; ++step) {  // k-step 2 qd + step: columns +2 step, +2 step + 1
            // A = (g, k = t) (g + 8, t) (g, t + 4) (g + 8, t + 4); B = (k = t, key g) (t + 4, g)
            const tf32::Split a[4] = {
                tf32::split(component(q0, 2 * step)), tf32::split(component(q8, 2 * step)),
                tf32::split(component(q0, 2 * step + 1)), tf32::split(component(q8, 2 * step + 1))};
            tf32::Split bk[kNT][2];
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
                bk[nt][0] = tf32::split(component(k[nt], 2 * step)),
                bk[nt][1] = tf32::split(component(k[nt], 2 * step + 1));
            // One fresh accumulator per k-step, added to S with an fp32 add: see "Accuracy".
            float part[kNT][4] = {};
            tf32::mma_3xtf32<kNT>(part, a, bk);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[nt][e] += part[nt][e];
        }
    }
}

// FA2 L10 (second half): O_i += P~ V_j. Key tile nt of P~ (fp32, in S's registers) is the A
// fragment (c0, c2, c1, c3) under the renumbering "key 8 nt + 2t is k = t, 8 nt + 2t + 1 is
// k = t + 4"; B's b0, b1 are those two rows of V_j, column 8 dn + g.
template <class Cfg, class Inspection = NoInspection>
__device__ __forceinline__ void tf32_accumulate_pv(float (&O)[Cfg::D / 8][4],
                                                   const float (&P)[Cfg::Bc / 8][4],
                                                   const float* sV, int lane,
                                                   Inspection&& inspection = {}) {
    constexpr int kDN = 8;  // output column tiles per pass: 8 B fragments = 32 registers split
    static_assert(Cfg::D % (8 * kDN) == 0, "D must be whole passes");
    const int g = lane / 4, t = lane % 4;
    // Per pass of kDN output tiles, per key k-step: P~ V_j into a fresh accumulator, then added
    // to O_i with fp32 adds (see "Accuracy" above). P~'s splits are redone per pass (D / 64
    // passes).
#pragma unroll
    for (int dn0 = 0; dn0 < Cfg::D / 8; dn0 += kDN) {
#pragma unroll
        for (int nt = 0; nt < Cfg::Bc / 8; ++nt) {
            const tf32::Split a[4] = {tf32::split(P[nt][0]), tf32::split(P[nt][2]),
                                      tf32::split(P[nt][1]), tf32::split(P[nt][3])};
            const float* v0 = sV + (8 * nt + 2 * t) * Cfg::kVStride + g;  // key 8 nt + 2t
            const float* v1 = v0 + Cfg::kVStride;                         // key 8 nt + 2t + 1
            float v[kDN][2];
#pragma unroll
            for (int n = 0; n < kDN; ++n) v[n][0] = v0[8 * (dn0 + n)], v[n][1] = v1[8 * (dn0 + n)];
            if (inspection.takes(nt))
#pragma unroll
                for (int n = 0; n < kDN; ++n) inspection.look(v[n][0]), inspection.look(v[n][1]);
            tf32::Split bv[kDN][2];
#pragma unroll
            for (int n = 0; n < kDN; ++n)
                bv[n][0] = tf32::split(v[n][0]), bv[n][1] = tf32::split(v[n][1]);
            float part[kDN][4] = {};
            tf32::mma_3xtf32<kDN>(part, a, bv);
#pragma unroll
            for (int n = 0; n < kDN; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) O[dn0 + n][e] += part[n][e];
        }
    }
}

// The values of K_j and V_j that tf32_scores and tf32_accumulate_pv have this warp's lanes look at
// (the same loads), for a tile the warp's own rows do not see (the causal diagonal, rows past
// N_q): the warp skips the products, and the warps that compute them rely on its share.
template <class Cfg>
__device__ __forceinline__ void tf32_inspect_skipped(const float* sK, const float* sV, int lane,
                                                     SplitInspection<Cfg::kWarps>& inspection) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll 1
    for (int qd = 0; qd < Cfg::D / 16; ++qd)
        if (inspection.takes(qd))
#pragma unroll
            for (int nt = 0; nt < Cfg::Bc / 8; ++nt) {
                const float4 k = *reinterpret_cast<const float4*>(
                    sK + (8 * nt + g) * Cfg::kQKStride + 16 * qd + 4 * t);
                inspection.look(k.x), inspection.look(k.y), inspection.look(k.z), inspection.look(k.w);
            }
#pragma unroll 1
    for (int nt = 0; nt < Cfg::Bc / 8; ++nt)
        if (inspection.takes(nt)) {
            const float* v0 = sV + (8 * nt + 2 * t) * Cfg::kVStride + g;  // key 8 nt + 2t
#pragma unroll
            for (int dn = 0; dn < Cfg::D / 8; ++dn)
                inspection.look(v0[8 * dn]), inspection.look(v0[Cfg::kVStride + 8 * dn]);
        }
}

// FA2 L4 / L7: rows [row0, row0 + kRows) of one head's (n x d) matrix, whose rows start `ld`
// floats apart (d when contiguous; below 2^31, as require_input_layout checks: an int, which at
// d = 128 keeps the 3xTF32 kernel from spilling where a 64-bit stride made it), into a tile of
// row stride kStride; rows past n and columns d..D-1 are zero-filled (cuda/stages/async_copy.cuh).
template <class Cfg, int kRows, int kStride>
__device__ __forceinline__ void tf32_load_tile(float* tile, const float* head, int ld, int row0,
                                               int n, int d) {
    const int valid_rows = row0 < n ? (n - row0 < kRows ? n - row0 : kRows) : 0;
    load_tile_async(tile, kStride, head + std::int64_t(row0) * ld, ld, kRows, Cfg::D, valid_rows, d,
                    int(threadIdx.x), Cfg::kThreads);
}

// cuda-fa2 v4's operand stages for the forward written once in cuda/stages/flash_forward.cuh.
// Shared memory (Cfg::SMEM_BYTES): Q_i (Br rows of kQKStride floats), then the ring; slot s holds
// K_j (Bc rows of kQKStride), then V_j (Bc rows of kVStride). Q_i stays in shared memory (see the
// header) and a negative scale is folded into it as it is read (negating is exact), so that the
// softmax sees maxima of |scale| s, as the shared stages expect.
template <class Cfg_, bool kInspect>
struct Tf32ForwardOps {
    using Cfg = Cfg_;
    using Inspection = std::conditional_t<kInspect, SplitInspection<Cfg_::kWarps>, NoInspection>;
    using Element = float;
    static constexpr bool kExactDifference = true;  // "Exponents as 2^((s - m) c)" above
    static constexpr bool kLazyRescale = false;  // Algorithm 1's update (the rule not timed here)
    static constexpr int Bc = Cfg::Bc;

    float* sQ;
    float* ring;
    const float* sQ_w;  // the warp's 16 rows of Q_i
    float q_sign;
    int d, lane;
    Inspection inspection;  // kInspect: Q_i in hold_q, K_j and V_j as they are split

    __device__ __forceinline__ Tf32ForwardOps(const mma::KernelParams& params, void* smem,
                                              int warp, int lane_)
        : sQ(static_cast<float*>(smem)),
          ring(sQ + Cfg::Br * Cfg::kQKStride),
          sQ_w(sQ + 16 * warp * Cfg::kQKStride),
          q_sign(params.problem.softmax_scale() < 0 ? -1.0f : 1.0f),
          d(int(params.problem.dim)),
          lane(lane_),
          inspection(Inspection::of_warp(warp)) {}

    // Slot s's tiles. (Pointer arithmetic, not an array of pointers: indexed by a run-time slot,
    // such an array would live in local memory.)
    __device__ __forceinline__ float* K_of(int s) const { return ring + s * Cfg::kSlotFloats; }
    __device__ __forceinline__ float* V_of(int s) const {
        return ring + s * Cfg::kSlotFloats + Bc * Cfg::kQKStride;
    }

    __device__ __forceinline__ void load_q(const float* Q_head, std::int64_t ld, int row_begin,
                                           int n) {
        tf32_load_tile<Cfg, Cfg::Br, Cfg::kQKStride>(sQ, Q_head, int(ld), row_begin, n, d);
    }
    __device__ __forceinline__ void load_kv(int slot, const float* K_head, const float* V_head,
                                            const QkvLayouts& at, int key_begin, int n) {
        tf32_load_tile<Cfg, Bc, Cfg::kQKStride>(K_of(slot), K_head, int(at.k.row), key_begin, n,
                                                d);
        tf32_load_tile<Cfg, Bc, Cfg::kVStride>(V_of(slot), V_head, int(at.v.row), key_begin, n,
                                               d);
    }
    // Q_i has landed. It is re-read (and split) per tile from shared memory; here each thread
    // looks at its share of it once.
    __device__ __forceinline__ void hold_q() {
        if constexpr (kInspect) {
            constexpr int kChunksPerRow = Cfg::D / 4, kChunks = Cfg::Br * kChunksPerRow;
            static_assert(kChunks % Cfg::kThreads == 0, "whole 16-byte chunks per thread");
#pragma unroll 1
            for (int c = int(threadIdx.x); c < kChunks; c += Cfg::kThreads) {
                const float4 x = *reinterpret_cast<const float4*>(
                    sQ + (c / kChunksPerRow) * Cfg::kQKStride + 4 * (c % kChunksPerRow));
                inspection.look(x.x), inspection.look(x.y);
                inspection.look(x.z), inspection.look(x.w);
            }
        }
    }
    // K_j and V_j are looked at as they are split (scores, accumulate_pv), or here, in slot s, by
    // a warp that skips them.
    __device__ __forceinline__ void inspect_skipped(int s) {
        if constexpr (kInspect) tf32_inspect_skipped<Cfg>(K_of(s), V_of(s), lane, inspection);
    }
    // Whether the split carried every input value the CTA loaded (CTA-wide: all threads call it).
    __device__ __forceinline__ bool computed_tile() const {
        if constexpr (kInspect) return !__syncthreads_or(!tf32::split_carries(inspection.seen));
        return true;
    }
    __device__ __forceinline__ void scores(float (&S)[1][Bc / 8][4], int slot) {
        tf32_scores<Cfg>(S[0], sQ_w, q_sign, K_of(slot), lane, inspection);
    }
    __device__ __forceinline__ void accumulate_pv(float (&O)[1][Cfg::D / 8][4],
                                                  const float (&P)[1][Bc / 8][4], int slot) {
        tf32_accumulate_pv<Cfg>(O[0], P[0], V_of(slot), lane, inspection);
    }
};

// One CTA = one query tile of one (batch, head). Grid (Tr, heads, batch), as cuda-tc's.
// kBlockMask: a separate instantiation for problems with a block mask. kInspect: see the header.
// gate: closed when the device entry's finiteness test chose the FFMA kernel
// (cuda/host/tensor_core_eligibility.hpp).
template <class Cfg, bool kBlockMask, bool kInspect>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::MIN_BLOCKS)
    fa2_tf32_kernel(const mma::KernelParams params, const KernelGate gate) {
    if (gate.closed()) return;
    extern __shared__ float4 smem_float4[];
    if (mma::flash_forward<Tf32ForwardOps<Cfg, kInspect>, kBlockMask>(params, smem_float4)) return;
    if constexpr (kInspect) {
        // The tile's inputs hold a value the split cannot carry: the CTA computes the same query
        // tile (flash_forward's L3) with the FFMA kernel's code. The barrier in computed_tile was
        // the last use of shared memory by the tensor-core code.
        const AttentionProblem& p = params.problem;
        fa2::fa2_forward_tile<typename Cfg::Ffma>(
            p, static_cast<const float*>(params.Q), static_cast<const float*>(params.K),
            static_cast<const float*>(params.V), params.in, static_cast<float*>(params.O),
            params.o_layout, params.lse,
            blockIdx.z, blockIdx.y, longest_first(p.causal, blockIdx.x, gridDim.x), smem_float4);
    }
}

// The launch, queued on `stream` (asynchronous), behind `gate`, on the grid (Tr, heads, batch).
template <class C>
void launch_fa2_tf32(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                     const QkvLayouts& at, float* O, const ArrayLayout& o_at, float* lse,
                     KernelGate gate, bool inspect, cudaStream_t stream) {
    mma::KernelParams params = mma::make_params(p, Q, K, V, O, lse);
    params.in = at, params.o_layout = o_at;
    const bool masked = p.block_mask.active();
    auto kernel = masked ? (inspect ? fa2_tf32_kernel<C, true, true> : fa2_tf32_kernel<C, true, false>)
                         : (inspect ? fa2_tf32_kernel<C, false, true> : fa2_tf32_kernel<C, false, false>);
    cuda::allow_dynamic_shared_memory(kernel, int(C::SMEM_BYTES));
    const dim3 grid(unsigned(tile_count(p.seq_q, C::Br)), unsigned(p.heads), unsigned(p.batch));
    kernel<<<grid, C::THREADS, C::SMEM_BYTES, stream>>>(params, gate);
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
