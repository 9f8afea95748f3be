// cuda/fa3/tensor_map.hpp — the host side of cuda-fa3's TMA copies: the tensor maps its kernels
// (cuda/fa3/kernel.cuh, cuda/fa3/backward_kernel.cuh) copy tiles through, and the alignment TMA
// needs of the arrays they describe.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/dtype.hpp"

namespace flashattn::fa3 {

// A 3-D map over `heads` arrays of rows x d 16-bit values of `dtype` (innermost first: d, rows,
// heads) whose boxes are 64 columns (one 128-byte panel) x box_rows rows, written to shared memory
// in the 128-byte swizzle that wgmma reads; rows past `rows` arrive as zeros.
CUtensorMap tile_map(const void* base, DType dtype, std::int64_t heads, std::int64_t rows,
                     std::int64_t d, int box_rows);

// TMA reads global memory from 16-byte aligned addresses only (cuTensorMapEncodeTiled): throws
// std::invalid_argument naming the array otherwise.
void require_tma_aligned(const void* array, const char* name);

}  // namespace flashattn::fa3
