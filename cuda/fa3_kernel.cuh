// cuda/fa3_kernel.cuh — cuda-fa3, stage 1: FlashAttention-2's forward with both products on
// Hopper's warpgroup matrix multiply (wgmma). Host side: cuda/fa3.cu. Needs sm_90a; in a build for
// other architectures the kernel body is empty and the backend is not registered.
//
// FlashAttention-3 (Shah et al., 2024, arXiv 2407.08608) builds on three ideas; this stage has the
// first, and the notes page (docs/cuda_fa3.md) measures it:
//   1. (here) wgmma, Section 3 / 2.2: a warpgroup (4 warps, 128 threads) multiplies 64 x N x 16
//      tiles with its operands read from shared memory by the tensor cores themselves, where
//      mma.sync (cuda-tc) needs every operand in registers, loaded by ldmatrix, 16 rows per warp.
//   2. (not yet) TMA loads and warp specialization, Section 3.1: a producer warp copies K_j, V_j
//      with the tensor memory accelerator into an mbarrier-guarded ring while consumer warpgroups
//      compute. Here every thread still issues cp.async, as cuda-tc does.
//   3. (not yet) softmax overlapped with the products, Section 3.2 (ping-pong between warpgroups,
//      and within one the next S while this P V runs). Here each wgmma batch is waited for at
//      once (wgmma.wait_group 0).
//
// What stays cuda-tc's (cuda/tc_kernel.cuh, cuda/mma_stages.cuh), called unchanged:
//   * tiles in shared memory: rows of d = 64 halves (128 bytes), 16-byte chunk c of row r at chunk
//     c ^ (r % 8) (swizzled_chunk). That is exactly wgmma's 128-byte swizzle, so the tensor cores
//     read cuda-tc's tiles as they are (the descriptors below, checked on an H100 by
//     cuda/tools/wgmma_probe.cu);
//   * the accumulator layout: warp w of a warpgroup holds rows 16 w + (g, g + 8), columns
//     8 i + 2t (+1) of a 64 x N wgmma result, which is m16n8's C layout tile by tile; so masking,
//     the online softmax (FA2 Algorithm 1 lines 9-10) and the epilogue (lines 12-15) are the
//     shared mma_stages, and P~ becomes wgmma's register A operand by the same packing as in
//     cuda-tc's accumulate_pv.
//
// FA2 Algorithm 1 lines: L3 grid (i, h, b) | L4 Q_i -> shared memory | L5 O, l, m = 0, 0, -inf |
// L6 loop over key tiles j | L7 K_j, V_j -> shared memory (cp.async ring) | L8 S = Q_i K_j^T on
// wgmma | L9-L10 mask_scores, online_softmax | L10 O += P~ V_j on wgmma | L12-L15 write_output.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/mma_stages.cuh"
#include "cuda/tc_kernel.cuh"
#include "cuda/tc_ptx.cuh"

namespace flashattn::fa3 {

using mma::KernelParams;

// One CTA: kWarpgroups warpgroups of 64 query rows each (Br = 64 kWarpgroups), key tiles of 64,
// d = 64, a ring of two K_j / V_j buffers.
template <class T_, int kWarpgroups_>
struct Fa3Tile {
    using T = T_;
    static constexpr int D = 64;
    static constexpr int kWarpgroups = kWarpgroups_;
    static constexpr int kWarps = 4 * kWarpgroups_;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMTiles = 1;    // mma_stages: one 16-row tile per warp
    static constexpr int kWarpRows = 16;
    static constexpr int Br = 64 * kWarpgroups_;
    static constexpr int Bc = 64;
    static constexpr int kStages = 2;
    static constexpr int kChunks = D / 8;
    // Tiles must start on 1024 bytes (the 128-byte swizzle repeats every 8 rows of 128 bytes):
    // the dynamic shared memory is over-allocated by 1024 and its start rounded up.
    static constexpr int kSmemBytes = (Br + 2 * kStages * Bc) * D * int(sizeof(T_)) + 1024;
};

// ---- wgmma -------------------------------------------------------------------------------------

// The shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): the start address,
// the stride between 8-row groups (1024 bytes: 8 rows of 128), and the 128-byte swizzle mode
// (bits 62-63 = 1). The leading offset is unused when a row is one swizzle width (checked).
__device__ __forceinline__ std::uint64_t smem_descriptor(const void* tile) {
    const std::uint32_t addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(tile));
    return std::uint64_t((addr >> 4) & 0x3FFF) | (std::uint64_t(1024 >> 4) << 32) |
           (std::uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Shared memory written by the generic proxy (cp.async, st.shared) and read next by the tensor
// cores' async proxy: each writing thread fences before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define FA3_D32                                                                                    \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA3_D32_INOUT(d)                                                                           \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),      \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),  \
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),  \
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),  \
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),  \
        "+f"(d[7][2]), "+f"(d[7][3])

// d (64 x 64, fp32) += A B for one k-step of 16: A and B from shared memory, both K-major (S =
// Q_i K_j^T: d contiguous in Q_i's and K_j's rows).
template <class T>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], std::uint64_t a, std::uint64_t b) {
    if constexpr (std::is_same_v<T, __half>)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FA3_D32
                     ", %32, %33, 1, 1, 1, 0, 0;\n"
                     : FA3_D32_INOUT(d)
                     : "l"(a), "l"(b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FA3_D32
                     ", %32, %33, 1, 1, 1, 0, 0;\n"
                     : FA3_D32_INOUT(d)
                     : "l"(a), "l"(b));
}

// d += A B for one k-step of 16: A from registers (the m16n8k16 A fragment of each warp's 16
// rows), B from shared memory MN-major (O += P~ V_j: V_j's rows are keys = k, d contiguous).
template <class T>
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const std::uint32_t (&a)[4],
                                         std::uint64_t b) {
    if constexpr (std::is_same_v<T, __half>)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FA3_D32
                     ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                     : FA3_D32_INOUT(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FA3_D32
                     ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                     : FA3_D32_INOUT(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// FA2 L8: S = Q_i K_j^T for the warpgroup's 64 rows, 4 k-steps of 16 (32 bytes into each 128-byte
// row per step).
template <class Cfg>
__device__ __forceinline__ void scores_wgmma(float (&S)[8][4], const typename Cfg::T* sQ_wg,
                                             const typename Cfg::T* sK) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::D / 16; ++kk)
        wgmma_ss<typename Cfg::T>(S, smem_descriptor(sQ_wg + 16 * kk), smem_descriptor(sK + 16 * kk));
    wgmma_commit();
    wgmma_wait_all();
}

// FA2 L10 (second half): O_i += P~ V_j, 4 k-steps of 16 keys (16 rows of V_j = 2048 bytes each).
// P~ is packed into A fragments as in cuda-tc's accumulate_pv.
template <class Cfg>
__device__ __forceinline__ void accumulate_pv_wgmma(float (&O)[8][4], const float (&P)[8][4],
                                                    const typename Cfg::T* sV) {
    using T = typename Cfg::T;
    std::uint32_t a[Cfg::Bc / 16][4];
#pragma unroll
    for (int kk = 0; kk < Cfg::Bc / 16; ++kk) {
        a[kk][0] = tc::pack2<T>(P[2 * kk][0], P[2 * kk][1]);
        a[kk][1] = tc::pack2<T>(P[2 * kk][2], P[2 * kk][3]);
        a[kk][2] = tc::pack2<T>(P[2 * kk + 1][0], P[2 * kk + 1][1]);
        a[kk][3] = tc::pack2<T>(P[2 * kk + 1][2], P[2 * kk + 1][3]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::Bc / 16; ++kk)
        wgmma_rs<T>(O, a[kk], smem_descriptor(sV + 16 * kk * Cfg::D));
    wgmma_commit();
    wgmma_wait_all();
}

// ---- the kernel ------------------------------------------------------------------------------
// Grid: (Tr, heads, batch). Block: Cfg::kThreads. Dynamic shared memory: Cfg::kSmemBytes: Q_i
// (Br x 64), then kStages K_j tiles, then kStages V_j tiles, from a 1024-byte boundary.
template <class Cfg, bool kBlockMask>
__global__ void __launch_bounds__(Cfg::kThreads) fa3_forward_kernel(const KernelParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = typename Cfg::T;
    constexpr int Br = Cfg::Br, Bc = Cfg::Bc, D = Cfg::D, kStages = Cfg::kStages;
    extern __shared__ uint4 smem_raw[];
    const std::uintptr_t raw = reinterpret_cast<std::uintptr_t>(smem_raw);
    T* sQ = reinterpret_cast<T*>((raw + 1023) & ~std::uintptr_t(1023));
    T* sK = sQ + Br * D;
    T* sV = sK + kStages * Bc * D;

    const AttentionProblem& p = params.problem;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, wg = warp / 4;
    const int seq_q = int(p.seq_q), seq_kv = int(p.seq_kv);

    // FA2 L3, as cuda-tc (under a causal mask the later query tiles first).
    const int Tr = int(gridDim.x);
    const int i = p.causal ? Tr - 1 - int(blockIdx.x) : int(blockIdx.x);
    const std::int64_t h = blockIdx.y, b = blockIdx.z;
    const int row_begin = i * Br, row_end = min(row_begin + Br, seq_q);
    const TileRange rows = {row_begin, row_end};
    // A warpgroup's wgmma is collective: whether to skip a key tile is decided per warpgroup.
    const int wg_begin = min(row_begin + 64 * wg, row_end);
    const TileRange wg_rows = {wg_begin, min(wg_begin + 64, row_end)};
    const int warp_begin = row_begin + 16 * warp;
    const T* Q_head = static_cast<const T*>(params.Q) + p.q_offset(b, h);
    const T* K_head = static_cast<const T*>(params.K) + p.kv_offset(b, h);
    const T* V_head = static_cast<const T*>(params.V) + p.kv_offset(b, h);

    int Tc_seen = int(tile_count(seq_kv, Bc));  // FA2 L6's range, cut at the causal diagonal
    if (p.causal) {
        const std::int64_t last_key = row_end - 1 + p.causal_offset();
        Tc_seen = last_key < 0 ? 0 : int(min(std::int64_t(Tc_seen), last_key / Bc + 1));
    }

    // FA2 L4 and L7 (issued): Q_i, and the first visible K_j, V_j into slot 0.
    tc::load_tile<Cfg, Br>(sQ, Q_head, row_begin, seq_q);
    int j = mma::next_key_tile<kBlockMask>(p, rows, 0, Tc_seen, Bc);
    if (j < Tc_seen) {
        tc::load_tile<Cfg, Bc>(sK, K_head, j * Bc, seq_kv);
        tc::load_tile<Cfg, Bc>(sV, V_head, j * Bc, seq_kv);
    }
    tc::cp_async_commit();

    // FA2 L5.
    float O[D / 8][4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[dt][e] = 0.0f;

    // FA2 L6.
    for (int cur = 0; j < Tc_seen; cur ^= 1) {
        // FA2 L7: tile j (and Q_i) has landed, is visible to the tensor cores (the fence), and
        // every warp is done with the other slot, which the next copy may now fill.
        tc::cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        const int next = mma::next_key_tile<kBlockMask>(p, rows, j + 1, Tc_seen, Bc);
        if (next < Tc_seen) {
            tc::load_tile<Cfg, Bc>(sK + (cur ^ 1) * Bc * D, K_head, next * Bc, seq_kv);
            tc::load_tile<Cfg, Bc>(sV + (cur ^ 1) * Bc * D, V_head, next * Bc, seq_kv);
        }
        tc::cp_async_commit();

        const int col_begin = j * Bc, col_end = min(col_begin + Bc, seq_kv);
        const TileVisibility seen =
            wg_rows.size() > 0
                ? mma::visibility<kBlockMask>(p, wg_rows, TileRange{col_begin, col_end})
                : TileVisibility::none;
        if (seen != TileVisibility::none) {
            float S[Bc / 8][4];
            scores_wgmma<Cfg>(S, sQ + 64 * wg * D, sK + cur * Bc * D);  // FA2 L8
            if (seen == TileVisibility::partial || col_end - col_begin < Bc ||
                wg_rows.size() < 64)
                mma::mask_scores<Cfg, kBlockMask>(S, p, warp_begin, col_begin, lane);
            mma::online_softmax<Cfg>(S, m, l, O, params.scale_log2);  // FA2 L9, L10 (rescale)
            accumulate_pv_wgmma<Cfg>(O, S, sV + cur * Bc * D);       // FA2 L10 (+ P~ V_j)
        }
        j = next;
    }

    // FA2 L12-L15.
    if (warp_begin < row_end) mma::write_output<Cfg>(O, m, l, params, warp_begin, b, h, lane);
#endif
}

}  // namespace flashattn::fa3
