// cuda/ptx/mma_sync.cuh — the tensor-core-era instructions cuda-tc is built from, as thin
// inline-PTX wrappers (sm_80+): ldmatrix (shared -> registers, already in fragment order),
// mma.sync m16n8k16 (one warp-wide 16x8x16 matrix product with fp32 accumulators), and a
// two-float -> two-half pack; with cp.async (cuda/ptx/cp_async.cuh: global -> shared copies that
// bypass registers) they are the whole kernel.
//
// ---------------------------------------------------------------------------------------------
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16").
// A warp's 32 lanes are numbered lane = 4*g + t, with g = lane / 4 (0..7) and t = lane % 4 (0..3).
// Every register holds two adjacent 16-bit values (A, B) or one fp32 value (C).
//
//   A = 16x16 (rows m, cols k), 4 registers a0..a3        C = D = 16x8 fp32, 4 registers c0..c3
//
//             k 0..7        k 8..15                                  n 0..7
//           +-------------+-------------+                   +---------------------+
//   m 0..7  | a0          | a2          |          m 0..7   | c0 c1               |
//           +-------------+-------------+                   +---------------------+
//   m 8..15 | a1          | a3          |          m 8..15  | c2 c3               |
//           +-------------+-------------+                   +---------------------+
//   lane (g, t) holds, in each 8x8 quarter, row g and      lane (g, t) holds (g, 2t) (g, 2t+1)
//   the pair of columns (2t, 2t+1)                         in c0 c1 and (g+8, 2t) (g+8, 2t+1)
//                                                          in c2 c3
//
//   B = 16x8 (rows k, cols n), 2 registers b0 b1 ("col" operand: stored with k contiguous)
//
//             n 0..7
//           +-------------+
//   k 0..7  | b0          |   lane (g, t) holds column n = g and the pair of rows (2t, 2t+1)
//   k 8..15 | b1          |
//           +-------------+
//
// Two facts the kernel is built on:
//   * The C fragments of two neighbouring n8 tiles of S (columns 0..7 and 8..15) are, register by
//     register, the A fragment of a 16x16 tile of P: (c0 c1 | c2 c3) of tile 0 are a0 | a1 and
//     those of tile 1 are a2 | a3 (same lane, same rows, same column pairs). So P never leaves
//     registers between S = Q K^T and O += P V: it is only rounded to 16 bits and repacked.
//   * ldmatrix.x4 loads four 8x8 blocks of 16-bit values from shared memory; lane l gives the
//     address of one 8-element (16-byte) row of block l / 8, and every lane receives, per block,
//     row g / columns (2t, 2t+1) -- exactly the A and C pattern above. With .trans it receives
//     column g / rows (2t, 2t+1) of each block instead -- the B pattern of a row-major matrix.
// ---------------------------------------------------------------------------------------------
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"

namespace flashattn::tc {

// ---- ldmatrix: shared -> registers in fragment order ---------------------------------------

__device__ inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem_row) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem_row) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ---- mma.sync m16n8k16: D = A B + C, fp32 accumulators -------------------------------------

template <class T>
__device__ inline void mma_m16n8k16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                    std::uint32_t b1);

template <>
__device__ inline void mma_m16n8k16<__half>(float (&c)[4], const std::uint32_t (&a)[4],
                                            std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ inline void mma_m16n8k16<__nv_bfloat16>(float (&c)[4], const std::uint32_t (&a)[4],
                                                   std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- two fp32 values -> one register of two 16-bit values (round to nearest even) -----------
// `lo` goes to the low half: the element with the smaller column index, as the fragments expect.

template <class T>
__device__ inline std::uint32_t pack2(float lo, float hi);

template <>
__device__ inline std::uint32_t pack2<__half>(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
}

template <>
__device__ inline std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
}

// Two neighbouring fp32 accumulator tiles of an m16n8 product (columns 16 kk .. +7 in `lo`,
// 16 kk + 8 .. +15 in `hi`), rounded to T, are exactly one A fragment of m16n8k16 with k = those
// 16 columns (compare the C and A layouts above): how P~ goes from the product S = Q K^T into
// P~ V without leaving registers (cuda-tc with mma.sync, cuda-fa3 with wgmma's register A).
template <class T>
__device__ inline void accumulators_to_a_fragment(std::uint32_t (&a)[4], const float (&lo)[4],
                                                  const float (&hi)[4]) {
    a[0] = pack2<T>(lo[0], lo[1]);
    a[1] = pack2<T>(lo[2], lo[3]);
    a[2] = pack2<T>(hi[0], hi[1]);
    a[3] = pack2<T>(hi[2], hi[3]);
}

}  // namespace flashattn::tc
