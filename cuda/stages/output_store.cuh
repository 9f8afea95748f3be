// cuda/stages/output_store.cuh — how a kernel stores a value of an output row: as float32, or
// rounded to nearest even into the inputs' 16-bit type (a DeviceForward's o_dtype). Written once
// for the epilogue of the tensor-core kernels (mma_stages.cuh's write_output) and for split-KV's
// combine (combine.cuh), which writes the merged O of a split forward.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/dtype.hpp"
#include "cuda/ptx/mma_sync.cuh"

namespace flashattn::mma {

// One or two adjacent values of an output row at element `at` of O, stored as `dtype` (float32,
// or the inputs' 16-bit type, rounded to nearest even). Two go in one store (8 or 4 bytes: the
// host checks the alignment, require_output_layout).
__device__ __forceinline__ void store_output_pair(void* O, DType dtype, std::int64_t at, float x,
                                                  float y) {
    if (dtype == DType::f32)
        *reinterpret_cast<float2*>(static_cast<float*>(O) + at) = make_float2(x, y);
    else if (dtype == DType::f16)
        *reinterpret_cast<std::uint32_t*>(static_cast<__half*>(O) + at) = tc::pack2<__half>(x, y);
    else
        *reinterpret_cast<std::uint32_t*>(static_cast<__nv_bfloat16*>(O) + at) =
            tc::pack2<__nv_bfloat16>(x, y);
}
__device__ __forceinline__ void store_output(void* O, DType dtype, std::int64_t at, float x) {
    if (dtype == DType::f32)
        static_cast<float*>(O)[at] = x;
    else if (dtype == DType::f16)
        static_cast<__half*>(O)[at] = __float2half_rn(x);
    else
        static_cast<__nv_bfloat16*>(O)[at] = __float2bfloat16_rn(x);
}

// Eight adjacent values of an output row at element `at` of O, from a 16-byte aligned address
// (the host checks: rows_in_16_byte_chunks): one 16-byte store in a 16-bit type, two in float32.
__device__ __forceinline__ void store_output_eight(void* O, DType dtype, std::int64_t at,
                                                   const float (&x)[8]) {
    if (dtype == DType::f32) {
        float4* to = reinterpret_cast<float4*>(static_cast<float*>(O) + at);
        to[0] = make_float4(x[0], x[1], x[2], x[3]);
        to[1] = make_float4(x[4], x[5], x[6], x[7]);
        return;
    }
    uint4 packed;
    std::uint32_t* words = reinterpret_cast<std::uint32_t*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        words[i] = dtype == DType::f16 ? tc::pack2<__half>(x[2 * i], x[2 * i + 1])
                                       : tc::pack2<__nv_bfloat16>(x[2 * i], x[2 * i + 1]);
    *reinterpret_cast<uint4*>(static_cast<char*>(O) + at * 2) = packed;
}

}  // namespace flashattn::mma
