// cuda/stages/backward_prepass.cuh — the stage every flash backward on the GPU starts with:
// D_i = rowsum(dO_i o O_i) (FlashAttention-2 Algorithm 2 line 4; the rule and why it is a dot
// product of length d: common/backward.hpp). Used by cuda-fa2 (float dO) and the 16-bit backwards
// (cuda-tc, cuda-fa3; cuda-fa3's device entry may give a 16-bit O, and strided dO and O).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/array_layout.hpp"
#include "common/problem.hpp"
#include "cuda/host/check.hpp"

namespace flashattn::cuda {

__device__ __forceinline__ double to_double(float x) { return x; }
__device__ __forceinline__ double to_double(__half x) { return __half2float(x); }
__device__ __forceinline__ double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }

// One warp per row of d values: D[row] = sum_k dO[row, k] O[row, k], summed in double as
// output_delta (common/backward.hpp) does. Rows are counted in contiguous order (B, H, N_q) and
// found where dO_at and O_at (resolved layouts) put them. Launch with 256 threads and
// ceil(rows / 8) blocks.
template <class In, class OutputType>
__global__ void delta_kernel(const In* dO, ArrayLayout dO_at, const OutputType* O,
                             ArrayLayout O_at, float* D, std::int64_t rows, std::int64_t heads,
                             std::int64_t seq_q, int d) {
    const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together
    const In* dO_row = dO + dO_at.row_start(row, heads, seq_q);
    const OutputType* O_row = O + O_at.row_start(row, heads, seq_q);
    double sum = 0.0;
    for (int k = lane; k < d; k += 32) sum += to_double(dO_row[k]) * to_double(O_row[k]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) D[row] = float(sum);
}

// The grid of a kernel with a warp per row and 8 warps (256 threads) per block, for the B H N_q
// rows of `p`: ceil(rows / 8) blocks (0 for no rows); std::invalid_argument when that is more
// than one launch takes. delta_kernel's, and the dQ pass's (cuda/stages/backward_postpass.cuh).
inline unsigned warp_per_row_blocks(const AttentionProblem& p) {
    const std::int64_t rows = p.batch * p.heads * p.seq_q;
    const std::int64_t blocks = (rows + 7) / 8;
    if (blocks > std::numeric_limits<int>::max())
        throw std::invalid_argument("batch*heads*seq_q = " + std::to_string(rows) +
                                    ": too many rows for one launch");
    return static_cast<unsigned>(blocks);
}

// The launch of delta_kernel for the B H N_q rows of `p` on `stream`.
template <class In, class OutputType>
void launch_delta(const AttentionProblem& p, const In* dO, const ArrayLayout& dO_at,
                  const OutputType* O, const ArrayLayout& O_at, float* D, cudaStream_t stream) {
    const unsigned blocks = warp_per_row_blocks(p);
    if (blocks == 0) return;
    delta_kernel<In, OutputType><<<blocks, 256, 0, stream>>>(
        dO, dO_at, O, O_at, D, p.batch * p.heads * p.seq_q, p.heads, p.seq_q,
        static_cast<int>(p.dim));
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
