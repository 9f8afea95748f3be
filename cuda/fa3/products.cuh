// cuda/fa3/products.cuh — the warpgroup products cuda-fa3's forward (cuda/fa3/kernel.cuh) and
// backward (cuda/fa3/backward_kernel.cuh) are built from, each a whole 64-row product issued on
// wgmma and committed as one group (not waited for: the caller decides when).
//
// Every tile in shared memory is a stack of panels of 64 columns (128 bytes per row, the 128-byte
// swizzle TMA writes); a tile of `rows` rows has its panel p at p * rows * 64 elements. Two ways to
// read a panel (PTX "Matrix Descriptor", checked on an H100 by cuda/tools/wgmma_probe.cu):
//   * K-major: the panel's rows are the product's rows (M or N) and its 64 columns are k. A k-step
//     of 16 is 32 bytes into the rows: Q_i and K_j for S = Q K^T.
//   * MN-major: the panel's rows are k and its 64 columns are M or N. A k-step of 16 is 16 rows
//     (16 * 64 elements): V_j for O += P~ V (keys are k, d is N). One wgmma may read several
//     such panels side by side as one operand N = 64 * panels wide, the step between them in the
//     descriptor's leading byte offset (hopper::smem_descriptor_panels; the probe checks one
//     panel, the cuda-fa3 forward and backward tests at d = 128 and 256 check the wide form).
#pragma once

#include <cstdint>

#include "cuda/ptx/hopper.cuh"
#include "cuda/ptx/mma_sync.cuh"

namespace flashattn::fa3 {

// The same address, which the compiler must treat as new: a tile's matrix descriptors (64 bits
// each, one per k-step and panel) are then computed where a product is issued, from a few
// registers, instead of all being computed once before the loop and held in registers for its
// whole length, which a kernel with five products cannot afford. Each product below takes its
// operands' descriptors once and steps through k-steps and panels with hopper::descriptor_plus.
template <class T>
__device__ __forceinline__ T* fresh(T* p) {
    asm volatile("" : "+l"(p));
    return p;
}

// An accumulator (rows of m16n8 C tiles) set to 0.
template <int kTiles>
__device__ __forceinline__ void zero(float (&acc)[kTiles][4]) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
}

// acc (64 x N) = A B^T over kPanels * 64 columns, A (64 rows) and B (N rows) both K-major; the
// first k-step overwrites the accumulator (no zeros written first: hopper::wgmma_ss says why).
// A's and B's panels lie a_panel and b_panel elements apart.
// Forward: S = Q_i K_j^T (FA2 Algorithm 1 L8). Backward: S^T = K_j Q_i^T and dP^T = V_j dO_i^T
// (Algorithm 2 L10, L13).
template <class T, int N, int kPanels>
__device__ __forceinline__ void issue_ab_t(float (&acc)[N / 8][4], const T* A, int a_panel,
                                           const T* B, int b_panel) {
    hopper::wgmma_fence_registers(acc);
    hopper::wgmma_fence();
    const std::uint64_t a = hopper::smem_descriptor(A), b = hopper::smem_descriptor(B);
    hopper::wgmma_ss<T, N, false>(acc, a, b);
#pragma unroll
    for (int step = 1; step < 4 * kPanels; ++step) {
        const int pn = step / 4, kk = step % 4;
        hopper::wgmma_ss<T, N>(acc, hopper::descriptor_plus(a, (pn * a_panel + 16 * kk) * sizeof(T)),
                               hopper::descriptor_plus(b, (pn * b_panel + 16 * kk) * sizeof(T)));
    }
    hopper::wgmma_commit();
}

// A fp32 accumulator (64 x 16 kKSteps, rows in m16n8's C layout) rounded to T and packed as
// wgmma's register A operand, kKSteps k-steps of 16 columns: wgmma's A fragment is m16n8k16's,
// warp by warp, so no data moves between threads. Forward: P~ (FA2 L10); backward: P^T and dS^T.
template <class T, int kKSteps>
__device__ __forceinline__ void pack_a(std::uint32_t (&a)[kKSteps][4],
                                       const float (&acc)[2 * kKSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) tc::accumulators_to_a_fragment<T>(a[kk], acc[2 * kk], acc[2 * kk + 1]);
}

// acc (64 x 64 kPanels) += A B: A from registers (kKSteps k-steps of 16, pack_a), B MN-major,
// kPanels panels of 64 columns of N lying b_panel elements apart, one wgmma per k-step over all
// of N. Forward: O += P~ V_j (FA2 L10); backward: dV_j += P^T dO_i and dK_j += dS^T Q_i
// (Algorithm 2 L12, L16).
template <class T, int kKSteps, int kPanels>
__device__ __forceinline__ void issue_a_regs_b(float (&acc)[8 * kPanels][4],
                                               const std::uint32_t (&a)[kKSteps][4], const T* B,
                                               int b_panel) {
    hopper::wgmma_fence_registers(acc);
    hopper::wgmma_fence();
    const std::uint32_t panel_bytes = kPanels > 1 ? std::uint32_t(b_panel * sizeof(T)) : 0;
    const std::uint64_t b = hopper::smem_descriptor_panels(B, panel_bytes);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
        hopper::wgmma_rs<T, 64 * kPanels>(acc, a[kk],
                                          hopper::descriptor_plus(b, 16 * kk * 64 * sizeof(T)));
    hopper::wgmma_commit();
}

// acc (64 x 128) += A B: A (64 rows) K-major from shared memory, kKSteps k-steps of 16 in panels
// of 64 columns lying a_panel elements apart; B MN-major, two panels of 64 columns b_panel elements
// apart, as issue_a_regs_b reads it. Backward at d = 256, where the queries are split between the
// warpgroups (Fa3BackwardTile's kQuerySplit): dV_j += P^T dO_i and dK_j += dS^T Q_i, P^T and dS^T
// from shared memory (Algorithm 2 L12, L16).
template <class T, int kKSteps>
__device__ __forceinline__ void issue_a_smem_b(float (&acc)[16][4], const T* A, int a_panel,
                                               const T* B, int b_panel) {
    hopper::wgmma_fence_registers(acc);
    hopper::wgmma_fence();
    const std::uint64_t a = hopper::smem_descriptor(A);
    const std::uint64_t b = hopper::smem_descriptor_panels(B, std::uint32_t(b_panel * sizeof(T)));
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
        hopper::wgmma_ss<T, 128, true, true>(
            acc, hopper::descriptor_plus(a, ((kk / 4) * a_panel + 16 * (kk % 4)) * sizeof(T)),
            hopper::descriptor_plus(b, 16 * kk * 64 * sizeof(T)));
    hopper::wgmma_commit();
}

// acc (64 x 64) = A B over kKSteps k-steps of 16, A and B both MN-major panels read from shared
// memory: A's panel has k rows of 64 M values, B's k rows of 64 N values. Backward: dQ_i = dS K_j
// with dS^T stored as (keys x queries) and K_j as (keys x d) (Algorithm 2 L15).
template <class T, int kKSteps>
__device__ __forceinline__ void issue_mn_major(float (&acc)[8][4], const T* A, const T* B) {
    hopper::wgmma_fence_registers(acc);
    hopper::wgmma_fence();
    const std::uint64_t a = hopper::smem_descriptor(A), b = hopper::smem_descriptor(B);
    hopper::wgmma_ss_mn_major<T, false>(acc, a, b);
#pragma unroll
    for (int kk = 1; kk < kKSteps; ++kk)
        hopper::wgmma_ss_mn_major<T>(acc, hopper::descriptor_plus(a, 16 * kk * 64 * sizeof(T)),
                                     hopper::descriptor_plus(b, 16 * kk * 64 * sizeof(T)));
    hopper::wgmma_commit();
}

// acc (64 x N) = A^T B^T over kKSteps k-steps of 16: A^T read from an MN-major panel (k rows of
// 64 M values), B K-major (N rows, k in panels of 64 lying b_panel elements apart, as issue_ab_t
// reads its B). Backward with a query tile of N = 80 rows, which a warpgroup's 64-row products
// cannot hold as M: dQ_i^T = K_j^T dS^T, K_j's panel of 64 d columns (keys as k) and dS stored as
// (queries x keys) (Algorithm 2 L15, transposed: FlashAttention-3's dQ_swapAB).
template <class T, int N, int kKSteps>
__device__ __forceinline__ void issue_at_b_t(float (&acc)[N / 8][4], const T* A, const T* B,
                                             int b_panel) {
    hopper::wgmma_fence_registers(acc);
    hopper::wgmma_fence();
    const std::uint64_t a = hopper::smem_descriptor(A), b = hopper::smem_descriptor(B);
    hopper::wgmma_ss<T, N, false, false, true>(acc, a, b);
#pragma unroll
    for (int kk = 1; kk < kKSteps; ++kk)
        hopper::wgmma_ss<T, N, true, false, true>(
            acc, hopper::descriptor_plus(a, 16 * kk * 64 * sizeof(T)),
            hopper::descriptor_plus(b, ((kk / 4) * b_panel + 16 * (kk % 4)) * sizeof(T)));
    hopper::wgmma_commit();
}

}  // namespace flashattn::fa3
