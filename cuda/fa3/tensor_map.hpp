// cuda/fa3/tensor_map.hpp — the host side of cuda-fa3's TMA copies: the tensor maps its kernels
// (cuda/fa3/kernel.cuh, cuda/fa3/backward_kernel.cuh) copy tiles through, and the alignment TMA
// needs of the arrays they describe.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/array_layout.hpp"
#include "common/dtype.hpp"

namespace flashattn::fa3 {

// A 4-D map over a (batch, heads, rows, d) array of 16-bit values of `dtype` lying at `layout`
// (resolved: its element strides; innermost first the map's axes are d, rows, heads, batch) whose
// boxes are 64 columns (one 128-byte panel) x box_rows rows of one head, written to shared memory
// in the 128-byte swizzle that wgmma reads; rows past `rows` arrive as zeros (and a box stored
// from shared memory writes none of them). TMA needs each
// stride to be a multiple of 16 bytes (require_tma_layout).
CUtensorMap tile_map(const void* base, DType dtype, std::int64_t batch, std::int64_t heads,
                     std::int64_t rows, std::int64_t d, const ArrayLayout& layout, int box_rows);

// A 4-D map over a contiguous (batch, heads, rows, d) float32 array whose boxes are 32 columns
// (one 128-byte row) x box_rows rows of one head in the 128-byte swizzle: the backward's dQ sum,
// which the kernel adds to box by box (TMA's reduce-add). The base must be 16-byte aligned.
CUtensorMap sum_map(float* base, std::int64_t batch, std::int64_t heads, std::int64_t rows,
                    std::int64_t d, int box_rows);

// TMA reaches global memory at 16-byte aligned addresses only (cuTensorMapEncodeTiled), and
// through strides (of 16-bit values here) that are positive multiples of 8 elements (16 bytes).
bool tma_aligned(const void* array);
bool tma_layout(const ArrayLayout& layout);

// The same two rules for an array TMA must read: throw std::invalid_argument naming the array.
void require_tma_aligned(const void* array, const char* name);
void require_tma_layout(const ArrayLayout& layout, const char* name);

}  // namespace flashattn::fa3
