// cuda/ptx/hopper.cuh — the Hopper (sm_90 / sm_90a) instructions cuda-fa3 is built from, one thin
// wrapper each, so that cuda/fa3/kernel.cuh reads as the algorithm:
//   * wgmma (warpgroup MMA, sm_90a): 64 x N x 16 products with operands read from shared memory by
//     the tensor cores, through a 64-bit matrix descriptor;
//   * mbarrier: shared-memory barriers that count arrivals and bytes of asynchronous copies, with
//     a phase bit a waiter tests (FlashAttention-3's producer/consumer ring, Section 3.1);
//   * TMA (the tensor memory accelerator, cp.async.bulk.tensor): one thread asks for a whole tile,
//     described by a CUtensorMap built on the host (cuda/fa3/backend.cu), and the copy engine
//     writes it into shared memory in wgmma's 128-byte swizzle, zero-filling rows past the tensor's
//     end; its reduce form adds a box from shared memory to global memory (cuda-fa3's dQ);
//   * setmaxnreg (sm_90a): a warpgroup gives registers back or takes more (warp specialization);
//   * named barriers (bar.sync / bar.arrive): warpgroups taking turns.
// PTX ISA references: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions",
// "mbarrier", "cp.async.bulk.tensor", "cp.reduce.async.bulk.tensor", "setmaxnreg".
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace flashattn::hopper {

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Stores to shared memory at a 32-bit shared address (smem_address). A store through a C++
// pointer is a generic one (ST.E, a 64-bit address computed per store); with the address in the
// shared window, a swizzled store is one XOR of the thread's address and an immediate offset
// (cuda-fa3's backward: dS^T and dQ's blocks). Not reordered with the other volatile memory
// instructions.
__device__ __forceinline__ void st_shared_b32(std::uint32_t at, std::uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32(std::uint32_t at, float x) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(x) : "memory");
}
__device__ __forceinline__ void st_shared_v2_f32(std::uint32_t at, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x), "f"(y) : "memory");
}
// Four 8 x 8 matrices of 16-bit values, each stored transposed (stmatrix .trans): register r[m]
// holds the thread's pair of matrix m in mma's fragment layout (row lane / 4, columns 2 (lane % 4)
// and + 1), and lane 8 m + c gives the address of the 16 bytes that row c of the stored matrix
// (column c of matrix m: its 8 values) goes to.
__device__ __forceinline__ void stmatrix_x4_trans(std::uint32_t at, const std::uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// ---- wgmma ---------------------------------------------------------------------------------

// The shared-memory matrix descriptor ("Matrix Descriptor Format"): the start address, the
// stride between 8-row groups (1024 bytes: 8 rows of 128), and the 128-byte swizzle mode (bits
// 62-63 = 1). The leading offset is unused when a row is one swizzle width: every operand here is
// a panel of rows of 64 halves (128 bytes), checked on an H100 by cuda/tools/wgmma_probe.cu.
__device__ __forceinline__ std::uint64_t smem_descriptor(const void* tile) {
    return std::uint64_t((smem_address(tile) >> 4) & 0x3FFF) | (std::uint64_t(1024 >> 4) << 32) |
           (std::uint64_t(1) << 62);
}

// The same for an MN-major operand wider than one panel: its panels of 64 columns lie
// panel_bytes apart, which wgmma reads as the leading byte offset (the step from one 64-column
// swizzle atom to the next along M or N; bits 16-29, in units of 16 bytes).
__device__ __forceinline__ std::uint64_t smem_descriptor_panels(const void* tile,
                                                                std::uint32_t panel_bytes) {
    return smem_descriptor(tile) | (std::uint64_t((panel_bytes >> 4) & 0x3FFF) << 16);
}

// The descriptor of the operand `bytes` (a multiple of 16) further on in shared memory: the next
// k-step or panel of a tile. The start address is the low 14 bits in units of 16 bytes, and every
// shared address fits them (228 KiB < 2^18 bytes), so the sum never carries out of the field: one
// 32-bit add of a constant to the tile's descriptor, where smem_descriptor(tile + offset) takes a
// conversion, a shift, a mask and a move to a uniform register for every k-step.
__device__ __forceinline__ std::uint64_t descriptor_plus(std::uint64_t desc, std::uint32_t bytes) {
    const std::uint32_t start = static_cast<std::uint32_t>(desc) + (bytes >> 4);
    return (desc & 0xFFFFFFFF00000000ull) | start;
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed wgmma groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across a wgmma that is still
// running on it (the registers are the hardware's until wgmma_wait).
template <int kRows>
__device__ __forceinline__ void wgmma_fence_registers(float (&d)[kRows][4]) {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
// The same for a register A operand: its registers must keep their values until the wgmma that
// reads them has completed, so they are "used" again after wgmma_wait.
template <int kRows>
__device__ __forceinline__ void wgmma_fence_registers(std::uint32_t (&a)[kRows][4]) {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}
// Shared memory written by ordinary stores and read next by the tensor cores or the copy engine
// (the async proxy): each writing thread fences before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define FA3_R0_31                                                                                 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FA3_R32_63                                                                                \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "   \
    "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FA3_R32_39 "%32, %33, %34, %35, %36, %37, %38, %39"
#define FA3_R64_95                                                                                \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "   \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FA3_R96_127                                                                                \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// 2 accumulator rows d[o], d[o + 1] (8 floats) as in-out operands.
#define FA3_ACC2(d, o)                                                                             \
    "+f"(d[o][0]), "+f"(d[o][1]), "+f"(d[o][2]), "+f"(d[o][3]), "+f"(d[o + 1][0]),                 \
        "+f"(d[o + 1][1]), "+f"(d[o + 1][2]), "+f"(d[o + 1][3])
// 8 accumulator rows d[o .. o + 7] (32 floats) as in-out operands.
#define FA3_ACC8(d, o)                                                                             \
    "+f"(d[o][0]), "+f"(d[o][1]), "+f"(d[o][2]), "+f"(d[o][3]), "+f"(d[o + 1][0]),                 \
        "+f"(d[o + 1][1]), "+f"(d[o + 1][2]), "+f"(d[o + 1][3]), "+f"(d[o + 2][0]),                \
        "+f"(d[o + 2][1]), "+f"(d[o + 2][2]), "+f"(d[o + 2][3]), "+f"(d[o + 3][0]),                \
        "+f"(d[o + 3][1]), "+f"(d[o + 3][2]), "+f"(d[o + 3][3]), "+f"(d[o + 4][0]),                \
        "+f"(d[o + 4][1]), "+f"(d[o + 4][2]), "+f"(d[o + 4][3]), "+f"(d[o + 5][0]),                \
        "+f"(d[o + 5][1]), "+f"(d[o + 5][2]), "+f"(d[o + 5][3]), "+f"(d[o + 6][0]),                \
        "+f"(d[o + 6][1]), "+f"(d[o + 6][2]), "+f"(d[o + 6][3]), "+f"(d[o + 7][0]),                \
        "+f"(d[o + 7][1]), "+f"(d[o + 7][2]), "+f"(d[o + 7][3])

// d (64 x N, fp32; warp w of the warpgroup holds rows 16 w + (g, g + 8), columns 8 i + 2t (+1),
// i.e. m16n8's C layout tile by tile) += A B for one k-step of 16, A (64 x 16) and B (N x 16)
// both read from shared memory "K-major" (the 16 k values of a row contiguous). N = 32, 64, 80 or
// 128. kTransposeB: B (16 x N) is read "MN-major" instead (the N values of a k row contiguous, as
// wgmma_rs reads it; N = 128 only). kTransposeA: A (16 x 64) is read MN-major (N = 80 only: the
// backward's dQ_i^T = K_j^T dS^T, K_j's panel read with keys as k). kAccumulate = false: d = A B
// (wgmma's scale-d operand 0), the first k-step of a product, so that no instruction writes zeros
// into d first: ptxas would make that wait for every product still running (warning C7517,
// "warpgroup.wait is injected").
template <class T, int N, bool kAccumulate = true, bool kTransposeB = false,
          bool kTransposeA = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], std::uint64_t a, std::uint64_t b) {
    static_assert(N == 32 || N == 64 || N == 80 || N == 128, "wgmma_ss: N = 32, 64, 80 or 128");
    static_assert(!kTransposeB || N == 128, "wgmma_ss: an MN-major B at N = 128 only");
    static_assert(!kTransposeA || N == 80, "wgmma_ss: an MN-major A at N = 80 only");
    constexpr bool kHalf = std::is_same_v<T, __half>;
    constexpr int kScaleD = kAccumulate ? 1 : 0;
    constexpr int kTransB = kTransposeB ? 1 : 0;
    constexpr int kTransA = kTransposeA ? 1 : 0;
    if constexpr (N == 32 && kHalf)
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, "
                     "%6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, %18, 1, 1, 0, 0;\n"
                     : FA3_ACC2(d, 0), FA3_ACC2(d, 2)
                     : "l"(a), "l"(b), "n"(kScaleD));
    else if constexpr (N == 32)
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, "
                     "%5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, %18, 1, 1, 0, "
                     "0;\n"
                     : FA3_ACC2(d, 0), FA3_ACC2(d, 2)
                     : "l"(a), "l"(b), "n"(kScaleD));
    else if constexpr (N == 80 && kHalf)
        asm volatile("wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {" FA3_R0_31
                     ", " FA3_R32_39 "}, %40, %41, %42, 1, 1, %43, 0;\n"
                     : FA3_ACC8(d, 0), FA3_ACC2(d, 8)
                     : "l"(a), "l"(b), "n"(kScaleD), "n"(kTransA));
    else if constexpr (N == 80)
        asm volatile("wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {" FA3_R0_31
                     ", " FA3_R32_39 "}, %40, %41, %42, 1, 1, %43, 0;\n"
                     : FA3_ACC8(d, 0), FA3_ACC2(d, 8)
                     : "l"(a), "l"(b), "n"(kScaleD), "n"(kTransA));
    else if constexpr (N == 64 && kHalf)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" FA3_R0_31
                     "}, %32, %33, %34, 1, 1, 0, 0;\n"
                     : FA3_ACC8(d, 0)
                     : "l"(a), "l"(b), "n"(kScaleD));
    else if constexpr (N == 64)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FA3_R0_31
                     "}, %32, %33, %34, 1, 1, 0, 0;\n"
                     : FA3_ACC8(d, 0)
                     : "l"(a), "l"(b), "n"(kScaleD));
    else if constexpr (kHalf)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" FA3_R0_31
                     ", " FA3_R32_63 "}, %64, %65, %66, 1, 1, 0, %67;\n"
                     : FA3_ACC8(d, 0), FA3_ACC8(d, 8)
                     : "l"(a), "l"(b), "n"(kScaleD), "n"(kTransB));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" FA3_R0_31
                     ", " FA3_R32_63 "}, %64, %65, %66, 1, 1, 0, %67;\n"
                     : FA3_ACC8(d, 0), FA3_ACC8(d, 8)
                     : "l"(a), "l"(b), "n"(kScaleD), "n"(kTransB));
}

// d (64 x N, N = 64, 128 or 256) += A B for one k-step of 16: A (64 x 16) from registers (each
// warp's m16n8k16 A fragment of its 16 rows), B (16 x N) from shared memory "MN-major" (the n
// values of a k row contiguous, i.e. V_j with keys as rows), in panels of 64 columns lying the
// descriptor's leading byte offset apart (smem_descriptor_panels) where N > 64. One instruction
// for all N columns: A's registers go to the tensor cores once per k-step, not once per panel.
template <class T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const std::uint32_t (&a)[4],
                                         std::uint64_t b) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_rs: N = 64, 128 or 256");
    constexpr bool kHalf = std::is_same_v<T, __half>;
    if constexpr (N == 64 && kHalf)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" FA3_R0_31
                     "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    else if constexpr (N == 64)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FA3_R0_31
                     "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    else if constexpr (N == 128 && kHalf)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" FA3_R0_31
                     ", " FA3_R32_63 "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0), FA3_ACC8(d, 8)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    else if constexpr (N == 128)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" FA3_R0_31
                     ", " FA3_R32_63 "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0), FA3_ACC8(d, 8)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    else if constexpr (kHalf)
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" FA3_R0_31
                     ", " FA3_R32_63 ", " FA3_R64_95 ", " FA3_R96_127
                     "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0), FA3_ACC8(d, 8), FA3_ACC8(d, 16), FA3_ACC8(d, 24)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" FA3_R0_31
                     ", " FA3_R32_63 ", " FA3_R64_95 ", " FA3_R96_127
                     "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0), FA3_ACC8(d, 8), FA3_ACC8(d, 16), FA3_ACC8(d, 24)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d (64 x 64, fp32) += A B for one k-step of 16, A (64 x 16) and B (16 x 64) both read from
// shared memory "MN-major" (transpose flags set): each operand's panel has the 16 k values as
// rows of 64 M (or N) values, as wgmma_rs reads its B. kAccumulate = false: d = A B (wgmma_ss).
template <class T, bool kAccumulate = true>
__device__ __forceinline__ void wgmma_ss_mn_major(float (&d)[8][4], std::uint64_t a,
                                                  std::uint64_t b) {
    constexpr int kScaleD = kAccumulate ? 1 : 0;
    if constexpr (std::is_same_v<T, __half>)
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" FA3_R0_31
                     "}, %32, %33, %34, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0)
                     : "l"(a), "l"(b), "n"(kScaleD));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FA3_R0_31
                     "}, %32, %33, %34, 1, 1, 1, 1;\n"
                     : FA3_ACC8(d, 0)
                     : "l"(a), "l"(b), "n"(kScaleD));
}

// ---- mbarrier ------------------------------------------------------------------------------

// Arrivals expected per phase; one thread initializes, then fence_barrier_init and a barrier
// make it visible to every thread and to the copy engine.
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)),
                 "r"(arrivals)
                 : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also tells the barrier to wait for `bytes` more of copy transactions.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(std::uint64_t* bar, std::uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     smem_address(bar)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Waits until the phase with this parity (0 or 1) has completed. A fresh barrier is in phase 0,
// and waiting for parity 1 returns at once (it counts as the phase before): that is how a
// producer's first pass over an empty ring goes through.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, std::uint32_t parity) {
    std::uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(smem_address(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

// ---- TMA -----------------------------------------------------------------------------------

// Copies the box at coordinates (c0, c1, c2, c3) of a 4-D tensor map (innermost first) into
// shared memory at dst (1024-byte aligned for the 128-byte swizzle); the bytes arrive on `bar`.
// The map must live in constant or grid-constant memory (a __grid_constant__ kernel parameter).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, std::uint64_t* bar,
                                            int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_address(dst)),
        "l"(reinterpret_cast<std::uint64_t>(map)), "r"(smem_address(bar)), "r"(c0), "r"(c1),
        "r"(c2), "r"(c3)
        : "memory");
}

// Writes the box at coordinates (c0, c1, c2, c3) of a 4-D tensor map from shared memory at src
// (laid out as a TMA load of that box would write it) to global memory, on the copy engine
// (cp.async.bulk.tensor ... .global.shared::cta): the issuing thread goes on at once. Box elements
// outside the tensor are not written. Fenced, grouped and waited for as tma_reduce_add_4d below.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1,
                                             int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
        " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)),
        "r"(smem_address(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// Adds the box at dst's coordinates (c0, c1, c2, c3) of a 4-D fp32 tensor map, element by
// element, from shared memory at src (laid out as a TMA load of that box would write it) to global
// memory, on the copy engine (cp.reduce.async.bulk.tensor ... .add): the issuing thread goes on at
// once. Box elements outside the tensor are not added. The threads that wrote src fence it for the
// async proxy first (fence_proxy_async). The issuing thread closes its additions into a group
// (bulk_commit) and waits for its groups: until they have read shared memory (bulk_wait_read,
// before src is written again) or until they are done in global memory (bulk_wait).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* src, int c0,
                                                  int c1, int c2, int c3) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
        " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)),
        "r"(smem_address(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Global memory written by the copy engine (the async proxy), before ordinary fences and stores
// publish it to other CTAs.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---- named barriers --------------------------------------------------------------------------

// Barrier `id` (1..15; 0 is __syncthreads) completes once `threads` threads have reached it, some
// waiting (sync) and some only signalling (arrive): how one warpgroup hands a turn to another.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same barrier reached from different places in the code (warpgroups of one CTA on different
// branches): barrier.sync without .aligned, the form bar.sync is, which asks every thread of the
// CTA to run the same instruction.
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- setmaxnreg ----------------------------------------------------------------------------

// The executing warpgroup's registers per thread become kRegs (a multiple of 8 in 24..256). Every
// warp of the warpgroup must execute it; the kernel needs a register cap at entry
// (__launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void release_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

#undef FA3_R0_31
#undef FA3_R32_63
#undef FA3_ACC8

}  // namespace flashattn::hopper
