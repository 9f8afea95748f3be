// cuda/stages/warp_softmax.cuh — the GPU side of the online-softmax rule: reductions across the
// lanes that share a row, and how a masked key is told apart in P.
//
// The rule itself (nan_max, exp_shifted, merge_softmax, ...) lives in common/online_softmax.hpp
// and is only *called* here: a warp shuffle is just another way to combine partial results, and
// it combines them with the same functions the CPU forms use.
#pragma once

#include <cstdint>

#include "common/online_softmax.hpp"

namespace flashattn::cuda {

// Max over the `width` consecutive lanes that share a row (width a power of two, <= 32). Built on
// nan_max, so a NaN in any lane reaches every lane (fmaxf would drop it).
template <int width>
__device__ inline float lanes_max(float x) {
#pragma unroll
    for (int offset = width / 2; offset > 0; offset /= 2)
        x = nan_max(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

template <int width>
__device__ inline float lanes_sum(float x) {
#pragma unroll
    for (int offset = width / 2; offset > 0; offset /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// (m, l) of a whole warp from each lane's (m, l): docs/online_softmax.md's eqs. 17/18 as a tree.
__device__ inline SoftmaxState warp_merge(SoftmaxState s) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        const SoftmaxState other{__shfl_xor_sync(0xffffffffu, s.m, offset),
                                 __shfl_xor_sync(0xffffffffu, s.l, offset)};
        const SoftmaxMerge merged = merge_softmax(s, other);
        s = {merged.m_new, merged.l_new};
    }
    return s;
}

// A masked key must be *absent* from O = P V, not "0 times V_j": a NaN or inf in a V row that a
// query row does not attend must not reach that row (0 * NaN = NaN). The flash kernels store the
// P entry of a masked key as -0.0f: it is 0 for every sum (l, the softmax), and on tiles that
// have masked keys the P V loop tests for exactly this bit pattern and skips the product.
// A real probability is never -0.0f (exp is >= +0), and a NaN never matches the pattern.
__device__ inline float masked_p() { return -0.0f; }
__device__ inline bool is_masked_p(float p) { return __float_as_uint(p) == 0x80000000u; }

// One float of a float4 by a compile-time index (after unrolling), for register micro-tiles.
__device__ inline float component(const float4& v, int k) {
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

}  // namespace flashattn::cuda
