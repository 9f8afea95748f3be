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
#include "cuda/stages/backward_prepass.cuh"
#include "cuda/stages/mma_stages.cuh"

namespace flashattn::cuda {

// One warp per row of d values: row `row` (counted in contiguous order over B, H, N_q) of the
// contiguous float32 `in` goes to where `at` (resolved) puts it in `out`, as `dtype`
// (mma::store_output, the epilogues' store). Launch with 256 threads and warp_per_row_blocks.
// static: a kernel defined in a header, one copy per translation unit that launches it.
static __global__ void store_rows_kernel(const float* in, void* out, ArrayLayout at, DType dtype,
                                         std::int64_t rows, std::int64_t heads,
                                         std::int64_t seq_q, int d) {
    const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const std::int64_t start = at.row_start(row, heads, seq_q);
    for (int k = lane; k < d; k += 32) mma::store_output(out, dtype, start + k, in[row * d + k]);
}

// dQ (the caller's array, at dq_at in `dtype`) from the accumulator dQ_sum (B H N_q d floats,
// contiguous), on `stream`.
inline void launch_store_dq(const AttentionProblem& p, const float* dQ_sum, void* dQ,
                            const ArrayLayout& dq_at, DType dtype, cudaStream_t stream) {
    const unsigned grid = warp_per_row_blocks(p);  // a warp per row, as the D pass
    if (grid == 0) return;
    store_rows_kernel<<<grid, 256, 0, stream>>>(dQ_sum, dQ, dq_at, dtype,
                                                p.batch * p.heads * p.seq_q, p.heads, p.seq_q,
                                                static_cast<int>(p.dim));
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
