// cuda/stages/async_copy.cuh — float32 tiles from global to shared memory with cp.async (sm_80+,
// cuda/ptx/cp_async.cuh), zero-filled outside the matrix.
//
// Algorithm 1 line 6 / line 8 ("load K_j, V_j / Q_i from HBM to on-chip SRAM") on the GPU. cp.async
// copies without passing through registers and lets the copy of the next tile run while the
// threads compute on the current one (FlashAttention-2's K/V streaming). Its src-size operand
// zero-fills what lies outside the matrix: the ragged last tile (N not a multiple of the block
// size) and the padding columns d..D-1 read as 0, so the dot products need no bounds checks.
#pragma once

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"

namespace flashattn::cuda {

// Asks for the 128-byte line holding `gmem` to be brought into L2, without waiting and without
// a register: a later load of it then waits on L2, not on HBM (cuda-fa1 reads O_i this way).
__device__ inline void prefetch_l2(const float* gmem) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem));
}

// Issues the copy of a rows x cols block (cols a multiple of 4) into shared memory `dst` with row
// stride `stride` floats. Source row r starts at src + r * ld. Element (r, c) is copied when
// r < valid_rows and c < valid_cols, and is 0 otherwise. All `nthreads` threads of the block call
// this; each issues its share. With ld % 4 == 0 and valid_cols % 4 == 0 the copies are 16 bytes
// wide, otherwise one float each (a d of 59 cannot be read with aligned 16-byte loads, and where
// rows are further apart than d, as in a view of a larger tensor, a 16-byte copy at a row's end
// would read the values past it). src must then be 16-byte aligned: the callers' arrays are.
__device__ inline void load_tile_async(float* dst, int stride, const float* src, std::int64_t ld,
                                       int rows, int cols, int valid_rows, int valid_cols,
                                       int tid, int nthreads) {
    if (ld % 4 == 0 && valid_cols % 4 == 0) {
        const int chunks_per_row = cols / 4;
        for (int idx = tid; idx < rows * chunks_per_row; idx += nthreads) {
            const int r = idx / chunks_per_row;
            const int c = (idx - r * chunks_per_row) * 4;
            const bool valid = r < valid_rows && c < valid_cols;
            cp_async_16(dst + r * stride + c, valid ? src + r * ld + c : src, valid);
        }
    } else {
        for (int idx = tid; idx < rows * cols; idx += nthreads) {
            const int r = idx / cols;
            const int c = idx - r * cols;
            const bool valid = r < valid_rows && c < valid_cols;
            cp_async_4(dst + r * stride + c, valid ? src + r * ld + c : src, valid);
        }
    }
}

}  // namespace flashattn::cuda
