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
#include "cuda/ptx/dependent_launch.cuh"

namespace flashattn::cuda {

__device__ __forceinline__ double to_double(float x) { return x; }
__device__ __forceinline__ double to_double(__half x) { return __half2float(x); }
__device__ __forceinline__ double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }

// kValues consecutive values of a row from `at`, as doubles: one value, or eight from a 16-byte
// aligned address in one 16-byte load (two for float32).
template <int kValues, class T>
__device__ __forceinline__ void load_values(const T* at, double (&x)[kValues]) {
    if constexpr (kValues == 1) {
        x[0] = to_double(at[0]);
    } else {
        static_assert(kValues == 8, "one value or eight");
        constexpr int kLoads = sizeof(T) == 4 ? 2 : 1;  // 16 bytes each
        uint4 raw[kLoads];
#pragma unroll
        for (int i = 0; i < kLoads; ++i) raw[i] = reinterpret_cast<const uint4*>(at)[i];
        const T* v = reinterpret_cast<const T*>(raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = to_double(v[i]);
    }
}

// Whether every row of an array (`base`, its resolved layout `at`, `d` values of `value_bytes`
// each) can be read or written 8 values at a time at 16-byte aligned addresses: d a multiple of 8,
// the base and every stride a multiple of 16 bytes.
inline bool rows_in_16_byte_chunks(const void* base, const ArrayLayout& at, std::int64_t d,
                                   std::int64_t value_bytes) {
    return d % 8 == 0 && reinterpret_cast<std::uintptr_t>(base) % 16 == 0 &&
           at.batch * value_bytes % 16 == 0 && at.head * value_bytes % 16 == 0 &&
           at.row * value_bytes % 16 == 0;
}

// D[row] = sum_k dO[row, k] O[row, k], summed in double as output_delta (common/backward.hpp)
// does, by kLanes lanes per row: 32 lanes reading a value each (any d, any alignment), or, where
// rows_in_16_byte_chunks holds for dO and O, 8 lanes reading 8 values each in one 16-byte load
// (a 16-bit row of d = 64 is then one load per lane, and a warp reads four whole rows). Rows are
// counted in contiguous order (B, H, N_q) and found where dO_at and O_at (resolved layouts) put
// them. Where dQ_sum is given (dQ's float32 sum, (B, H, N_q, d) at dQ_at), the row's lanes also
// zero its row of dQ_sum, which the backward kernel then adds to (Algorithm 2 line 3, dQ = 0):
// one launch fewer than a separate memset, as FlashAttention-3's pre-pass does. The backward kernel
// queued next may be placed at once (a dependent launch: it waits for this grid before it reads D
// or adds into dQ_sum). Launch with 256 threads and row_blocks(p, kLanes).
template <class In, class OutputType, int kLanes>
__global__ void delta_kernel(const In* dO, ArrayLayout dO_at, const OutputType* O,
                             ArrayLayout O_at, float* D, float* dQ_sum, ArrayLayout dQ_at,
                             std::int64_t rows, std::int64_t heads, std::int64_t seq_q, int d) {
    static_assert(kLanes == 32 || kLanes == 8, "a warp or a quarter of one per row");
    allow_dependent_launch();
    constexpr int kValues = kLanes == 32 ? 1 : 8;  // per load
    const std::int64_t row = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kLanes;
    const int lane = threadIdx.x % 32, part = lane % kLanes;
    if (row >= rows) return;  // a row's lanes leave together
    if (dQ_sum != nullptr) {  // the row's lanes write consecutive floats: whole 32-byte sectors
        float* dQ_row = dQ_sum + dQ_at.row_start(row, heads, seq_q);
        for (int k = part; k < d; k += kLanes) dQ_row[k] = 0.0f;
    }
    const In* dO_row = dO + dO_at.row_start(row, heads, seq_q);
    const OutputType* O_row = O + O_at.row_start(row, heads, seq_q);
    double sum = 0.0;
    for (int k = part * kValues; k < d; k += kLanes * kValues) {
        double x[kValues], y[kValues];
        load_values(dO_row + k, x);
        load_values(O_row + k, y);
#pragma unroll
        for (int i = 0; i < kValues; ++i) sum += x[i] * y[i];
    }
    // The row's lanes, kLanes of the warp from a multiple of kLanes, sum their parts.
    const unsigned row_lanes =
        kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1u) << (lane / kLanes * kLanes);
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(row_lanes, sum, offset);
    if (part == 0) D[row] = float(sum);
}

// The grid of a kernel with `lanes` threads per row and 256 threads per block, for the B H N_q
// rows of `p`: ceil(rows lanes / 256) blocks (0 for no rows); std::invalid_argument when that is
// more than one launch takes. delta_kernel's, and the dQ pass's
// (cuda/stages/backward_postpass.cuh).
inline unsigned row_blocks(const AttentionProblem& p, int lanes) {
    const std::int64_t rows = p.batch * p.heads * p.seq_q;
    const std::int64_t blocks = (rows * lanes + 255) / 256;
    if (blocks > std::numeric_limits<int>::max())
        throw std::invalid_argument("batch*heads*seq_q = " + std::to_string(rows) +
                                    ": too many rows for one launch");
    return static_cast<unsigned>(blocks);
}

// The launch of delta_kernel for the B H N_q rows of `p` on `stream`: 8 lanes per row where
// both arrays allow 16-byte loads, 32 otherwise. dQ_sum: null, or dQ's float32 sum to zero on
// the way, at dQ_at (resolved; contiguous where not given).
template <class In, class OutputType>
void launch_delta(const AttentionProblem& p, const In* dO, const ArrayLayout& dO_at,
                  const OutputType* O, const ArrayLayout& O_at, float* D, float* dQ_sum,
                  cudaStream_t stream, const ArrayLayout& dQ_at = {}) {
    const bool vector = rows_in_16_byte_chunks(dO, dO_at, p.dim, sizeof(In)) &&
                        rows_in_16_byte_chunks(O, O_at, p.dim, sizeof(OutputType));
    const int lanes = vector ? 8 : 32;
    const unsigned blocks = row_blocks(p, lanes);
    if (blocks == 0) return;
    const auto kernel = vector ? delta_kernel<In, OutputType, 8> : delta_kernel<In, OutputType, 32>;
    kernel<<<blocks, 256, 0, stream>>>(dO, dO_at, O, O_at, D, dQ_sum,
                                       dQ_at.resolved(p.heads, p.seq_q, p.dim),
                                       p.batch * p.heads * p.seq_q, p.heads, p.seq_q,
                                       static_cast<int>(p.dim));
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
