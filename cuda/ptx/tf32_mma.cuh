// cuda/ptx/tf32_mma.cuh — float32 matrix products on tensor cores by "3xTF32" (sm_80+): the one
// instruction (mma.sync m16n8k8 with tf32 inputs, fp32 accumulators) and the split of a float
// into two tf32 values that makes three of them as accurate as plain fp32 FMAs.
//
// Why: an H100/H200 runs fp32 FMAs at ~67 TFLOP/s but tf32 tensor-core products at ~8x that.
// A tf32 value keeps only 10 of fp32's 23 mantissa bits, so one tf32 product is far less
// accurate than fp32 (relative error ~1e-3). Splitting x = big + small, with big = tf32(x) and
// small = tf32(x - big), carries 21-22 bits; the product
//     a b ~= a_big b_big + a_big b_small + a_small b_big          (a_small b_small dropped, ~2^-22)
// is then as accurate as an fp32 FMA chain, at three tensor-core products per product. The same
// trick is PyTorch's fp32 EFFICIENT_ATTENTION (CUTLASS OpMultiplyAddFastF32) and Triton's
// "tf32x3". The small products go first so that the large one is added to a nearly final sum.
//
// What the split cannot carry: a NaN, an inf, and a finite value within half a tf32 unit of
// FLT_MAX (it rounds to inf). With the rounding below, inf splits into (inf, -0), so a product
// with a value whose small part is 0 gives inf * 0 = NaN where fp32 gives inf, and a NaN whose top
// mantissa bits are all set (the NaN a GPU's arithmetic makes) into (-0, -0): it would vanish.
// Callers either check their inputs first (cuda-fa1, cuda-fa2's backward, and its forward past
// 2^30 FLOPs) or track what they split (split_carries: cuda-fa2's forward on smaller problems)
// and compute a tile that holds such a value another way.
//
// ---------------------------------------------------------------------------------------------
// Fragment layouts of mma.sync.m16n8k8 .tf32 (PTX ISA, "Matrix Fragments for mma.m16n8k8").
// lane = 4 g + t, g = lane / 4 (0..7), t = lane % 4 (0..3); one 32-bit value per register.
//
//   A = 16 x 8 (rows m, cols k)       B = 8 x 8 (rows k, cols n)      C = 16 x 8 fp32
//     a0 = (g,     t)                   b0 = (k = t,     n = g)          c0 = (g,     2t)
//     a1 = (g + 8, t)                   b1 = (k = t + 4, n = g)          c1 = (g,     2t + 1)
//     a2 = (g,     t + 4)                                                 c2 = (g + 8, 2t)
//     a3 = (g + 8, t + 4)                                                 c3 = (g + 8, 2t + 1)
//
// C's layout is the same as that of m16n8k16 (cuda/ptx/mma_sync.cuh), so the softmax code that
// works on cuda-tc's accumulators works on these unchanged.
//
// The k index of a product is summed over, so it may be *renumbered* freely, as long as A and B
// use the same renumbering. The kernels use this twice:
//   * S = Q K^T, k = head dim: in k-step pair (2q, 2q + 1) lane t takes dims 16q + 4t + {0, 1}
//     (step 2q: k = t -> +0, k = t + 4 -> +1) and 16q + 4t + {2, 3} (step 2q + 1). Those are
//     4 consecutive floats: one 16-byte shared-memory load gives a lane its A (or B) values of
//     two k-steps.
//   * O = P V, k = key: the S accumulator of key tile nt holds keys 8 nt + 2t, 8 nt + 2t + 1 in
//     (c0, c1) and (c2, c3). Calling key 8 nt + 2t "k = t" and key 8 nt + 2t + 1 "k = t + 4"
//     makes (c0, c2, c1, c3) exactly an A fragment (a0, a1, a2, a3): P stays in registers, and
//     B takes V rows 8 nt + 2t (b0) and 8 nt + 2t + 1 (b1).
// ---------------------------------------------------------------------------------------------
#pragma once

#include <cstdint>

namespace flashattn::tf32 {

// A float as big + small, both tf32 bit patterns (the mma reads a 32-bit register per value).
struct Split {
    std::uint32_t big, small;
};

// Round an fp32 bit pattern to the nearest tf32 (ties away from zero): add half a tf32 unit in
// the last place (bit 12) and clear the 13 bits tf32 drops. For finite x this is exactly
// cvt.rna.tf32.f32, in 2 instructions instead of the 4 that ptxas makes of the cvt (an inf/NaN
// test, an add, a select, the mask: read with nvdisasm in a sm_90 build). The inf/NaN test is
// not needed here: the kernels take finite inputs only (see above), and a finite x within half a
// tf32 unit of FLT_MAX rounds to inf either way.
__device__ __forceinline__ std::uint32_t round_to_tf32(std::uint32_t bits) {
    return (bits + 0x1000u) & 0xffffe000u;
}

// 5 instructions per float (2 + an exact fp32 subtraction + 2), where two cvt's took 8: in the
// kernels the splits are most of the non-mma work, so this is worth the hand-written rounding
// (measured, H100: cuda-fa2 13-14% faster, docs/cuda_fp32_notes.md).
__device__ __forceinline__ Split split(float x) {
    const std::uint32_t big = round_to_tf32(__float_as_uint(x));
    return {big, round_to_tf32(__float_as_uint(x - __uint_as_float(big)))};  // x - big is exact
}

// The running largest |x| of the values a kernel has split, a NaN kept (PTX max.NaN; fmaxf would
// drop a NaN and hide it). Start from 0.
__device__ __forceinline__ float largest_magnitude(float seen, float x) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(seen), "f"(fabsf(x)));
    return r;
}

// Whether the split carries every value whose largest_magnitude is `seen`: false for a NaN, an inf
// and |x| >= the bits 0x7f7ff000, from which round_to_tf32 gives inf.
__device__ __forceinline__ bool split_carries(float seen) {
    return seen < __uint_as_float(0x7f7ff000u);  // false for NaN
}

// c += a b for one 16 x 8 x 8 product of tf32 values. Not volatile: the instruction has no side
// effect, so the compiler may interleave independent products.
__device__ __forceinline__ void mma_m16n8k8(float (&c)[4], std::uint32_t a0, std::uint32_t a1,
                                            std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                            std::uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c[n] += a b[n] (n < kN) in fp32 accuracy: one A fragment against kN B fragments (b[n][0], b[n][1]
// = b0, b1), the three products of the 3xTF32 split, small ones first. Pass by pass over n, so
// that consecutive mma's write different accumulators and need not wait for each other.
template <int kN>
__device__ __forceinline__ void mma_3xtf32(float (&c)[kN][4], const Split (&a)[4],
                                           const Split (&b)[kN][2]) {
#pragma unroll
    for (int n = 0; n < kN; ++n)
        mma_m16n8k8(c[n], a[0].small, a[1].small, a[2].small, a[3].small, b[n][0].big,
                    b[n][1].big);
#pragma unroll
    for (int n = 0; n < kN; ++n)
        mma_m16n8k8(c[n], a[0].big, a[1].big, a[2].big, a[3].big, b[n][0].small, b[n][1].small);
#pragma unroll
    for (int n = 0; n < kN; ++n)
        mma_m16n8k8(c[n], a[0].big, a[1].big, a[2].big, a[3].big, b[n][0].big, b[n][1].big);
}

// c += a b for a single accumulator (three dependent products: prefer the kN form in loops).
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const Split (&a)[4], Split b0,
                                           Split b1) {
    float(&c1)[1][4] = *reinterpret_cast<float(*)[1][4]>(&c);
    const Split b[1][2] = {{b0, b1}};
    mma_3xtf32<1>(c1, a, b);
}

}  // namespace flashattn::tf32
