// cuda/stages/backward_postpass.cuh — the stage a backward ends with when its caller wants dQ in
// another form than the one the kernel adds into: dQ is summed by fp32 atomics (FlashAttention-2
// Algorithm 2 line 15, every key tile adding its part) into contiguous float32 working memory, and
// this pass writes it once to the caller's array, at its layout and in its type (float32, or the
// inputs' 16-bit type rounded to nearest even). Used by cuda-fa3's device entry (a PyTorch caller
// gets dQ in q's dtype and order, with no cast of its own).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/array_layout.hpp"
#include "common/dtype.hpp"
#include "common/problem.hpp"
#include "cuda/host/check.hpp"

namespace flashattn::cuda {

__device__ __forceinline__ void store_value(float* out, float x) { *out = x; }
__device__ __forceinline__ void store_value(__half* out, float x) { *out = __float2half_rn(x); }
__device__ __forceinline__ void store_value(__nv_bfloat16* out, float x) {
    *out = __float2bfloat16_rn(x);
}

// One warp per row of d values: row `row` (counted in contiguous order over B, H, N_q) of the
// contiguous float32 `in` goes to where `at` (resolved) puts it in `out`. Launch with 256 threads
// and ceil(rows / 8) blocks.
template <class Out>
__global__ void store_rows_kernel(const float* in, Out* out, ArrayLayout at, std::int64_t rows,
                                  std::int64_t heads, std::int64_t seq_q, int d) {
    const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    Out* out_row = out + at.row_start(row, heads, seq_q);
    for (int k = lane; k < d; k += 32) store_value(out_row + k, in[row * d + k]);
}

// dQ (the caller's array, at dq_at in `dtype`) from the accumulator dQ_sum (B H N_q d floats,
// contiguous), on `stream`.
inline void launch_store_dq(const AttentionProblem& p, const float* dQ_sum, void* dQ,
                            const ArrayLayout& dq_at, DType dtype, cudaStream_t stream) {
    const std::int64_t rows = p.batch * p.heads * p.seq_q;
    const std::int64_t blocks = (rows + 7) / 8;  // 8 warps of 32 threads, a row each
    if (blocks > std::numeric_limits<int>::max())
        throw std::invalid_argument("batch*heads*seq_q = " + std::to_string(rows) +
                                    ": too many rows for one launch");
    if (blocks == 0) return;
    const auto grid = static_cast<unsigned>(blocks);
    const int d = static_cast<int>(p.dim);
    if (dtype == DType::f32)
        store_rows_kernel<<<grid, 256, 0, stream>>>(dQ_sum, static_cast<float*>(dQ), dq_at, rows,
                                                    p.heads, p.seq_q, d);
    else if (dtype == DType::f16)
        store_rows_kernel<<<grid, 256, 0, stream>>>(dQ_sum, static_cast<__half*>(dQ), dq_at, rows,
                                                    p.heads, p.seq_q, d);
    else
        store_rows_kernel<<<grid, 256, 0, stream>>>(dQ_sum, static_cast<__nv_bfloat16*>(dQ), dq_at,
                                                    rows, p.heads, p.seq_q, d);
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
