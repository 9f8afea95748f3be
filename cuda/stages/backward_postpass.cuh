// cuda/stages/backward_postpass.cuh — the stage a backward ends with when its caller wants dQ in
// another form than the one the kernel adds into: dQ is summed by fp32 atomics (FlashAttention-2
// Algorithm 2 line 15, every key tile adding its part) into contiguous float32 working memory, and
// this pass writes it once to the caller's array, at its layout and in its type (float32, or the
// inputs' 16-bit type rounded to nearest even). Used by cuda-fa3's device entry (a PyTorch caller
// gets dQ in q's dtype and order, with no cast of its own).
#pragma once

#include <cstdint>

#include "common/array_layout.hpp"
#include "common/dtype.hpp"
#include "common/problem.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/dependent_launch.hpp"
#include "cuda/ptx/dependent_launch.cuh"
#include "cuda/stages/backward_prepass.cuh"
#include "cuda/stages/mma_stages.cuh"

namespace flashattn::cuda {

// Row `row` (counted in contiguous order over B, H, N_q) of the contiguous float32 `in` goes to
// where `at` (resolved) puts it in `out`, as `dtype`, by kValues values per thread: one value per
// thread, a warp per row (any d, any alignment; mma::store_output, the epilogues' store), or, where
// rows_in_16_byte_chunks holds for `in` and `out`, eight values per thread in 16-byte loads and
// stores (mma::store_output_eight), d / 8 threads per row. Launch with 256 threads and
// row_blocks (cuda/stages/backward_prepass.cuh) for those threads per row. static: a kernel
// defined in a header, one copy per translation unit that launches it.
template <int kValues>
static __global__ void store_rows_kernel(const float* in, void* out, ArrayLayout at, DType dtype,
                                         std::int64_t rows, std::int64_t heads,
                                         std::int64_t seq_q, int d) {
    wait_for_prerequisite_grid();  // launched to overlap the backward kernel's end: dQ_sum is done
    const std::int64_t thread = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    if constexpr (kValues == 1) {
        const std::int64_t row = thread / 32;
        if (row >= rows) return;
        const std::int64_t start = at.row_start(row, heads, seq_q);
        for (int k = threadIdx.x % 32; k < d; k += 32)
            mma::store_output(out, dtype, start + k, in[row * d + k]);
    } else {
        static_assert(kValues == 8, "one value or eight");
        const std::int64_t chunks = d / 8, row = thread / chunks;
        if (row >= rows) return;
        const int k = static_cast<int>(thread % chunks) * 8;
        const float4* from = reinterpret_cast<const float4*>(in + row * d + k);
        const float4 a = from[0], b = from[1];
        const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        mma::store_output_eight(out, dtype, at.row_start(row, heads, seq_q) + k, x);
    }
}

// dQ (the caller's array, at dq_at in `dtype`) from the accumulator dQ_sum (B H N_q d floats,
// contiguous), on `stream`, as a dependent launch (cuda/host/dependent_launch.hpp): its CTAs may be
// placed while the backward kernel before it ends, and wait for it before reading dQ_sum.
inline void launch_store_dq(const AttentionProblem& p, const float* dQ_sum, void* dQ,
                            const ArrayLayout& dq_at, DType dtype, cudaStream_t stream) {
    const bool vector =
        rows_in_16_byte_chunks(dQ_sum, ArrayLayout::contiguous(p.heads, p.seq_q, p.dim), p.dim,
                               4) &&
        rows_in_16_byte_chunks(dQ, dq_at, p.dim, dtype == DType::f32 ? 4 : 2);
    // A warp per row, or d / 8 threads per row.
    const int lanes = vector ? static_cast<int>(p.dim / 8) : 32;
    const unsigned grid = row_blocks(p, lanes);
    if (grid == 0) return;
    const auto kernel = vector ? store_rows_kernel<8> : store_rows_kernel<1>;
    launch_overlapping_previous(kernel, dim3(grid), dim3(256), 0, stream, dQ_sum, dQ, dq_at, dtype,
                                p.batch * p.heads * p.seq_q, p.heads, p.seq_q,
                                static_cast<int>(p.dim));
}

}  // namespace flashattn::cuda
