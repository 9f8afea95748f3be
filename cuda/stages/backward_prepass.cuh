// cuda/stages/backward_prepass.cuh — the stage every flash backward on the GPU starts with:
// D_i = rowsum(dO_i o O_i) (FlashAttention-2 Algorithm 2 line 4; the rule and why it is a dot
// product of length d: common/backward.hpp). Used by cuda-fa2 (float dO) and cuda-tc (16-bit dO).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda/host/check.hpp"

namespace flashattn::cuda {

__device__ __forceinline__ double to_double(float x) { return x; }
__device__ __forceinline__ double to_double(__half x) { return __half2float(x); }
__device__ __forceinline__ double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }

// One warp per row of d values: D[row] = sum_k dO[row, k] O[row, k], summed in double as
// output_delta (common/backward.hpp) does. Launch with 256 threads and ceil(rows / 8) blocks.
template <class In>
__global__ void delta_kernel(const In* dO, const float* O, float* D, std::int64_t rows, int d) {
    const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;  // whole warps leave together
    double sum = 0.0;
    for (int k = lane; k < d; k += 32) sum += to_double(dO[row * d + k]) * to_double(O[row * d + k]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) D[row] = float(sum);
}

// The launch of delta_kernel for `rows` rows on `stream`; std::invalid_argument when the grid
// would be too large.
template <class In>
void launch_delta(const In* dO, const float* O, float* D, std::int64_t rows, int d,
                  cudaStream_t stream) {
    const std::int64_t blocks = (rows + 7) / 8;  // 8 warps of 32 threads, a row each
    if (blocks > std::numeric_limits<int>::max())
        throw std::invalid_argument("batch*heads*seq_q = " + std::to_string(rows) +
                                    ": too many rows for one launch");
    if (blocks == 0) return;
    delta_kernel<In><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dO, O, D, rows, d);
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
