// cuda/fa1/backend.hpp — cuda-fa1, Algorithm 1 of FlashAttention as the paper ran it (see
// cuda/fa1/backend.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "common/backend.hpp"

namespace flashattn::cuda {

// What Algorithm 1 line 1 chose on this device, and the shared memory that takes.
struct Fa1Plan {
    std::int64_t M = 0;           // SRAM size in floats used by line 1 (0: block sizes given)
    BlockSizes blocks;            // Br, Bc
    std::int64_t Tr = 0, Tc = 0;  // line 3
    std::size_t smem_bytes = 0;   // K_j, V_j, Q_i, S_ij and the row statistics, padded
    std::int64_t row_groups = 1;  // thread blocks per (batch, head), each owning Tr/row_groups
                                  // query blocks
};

// Block sizes: p.block_q/block_kv if given, else line 1 on p.sram_floats if given, else line 1
// on M = the shared memory one thread block may use on this device (reduced until K_j, V_j,
// Q_i *and* S_ij fit, since the paper's M counts only the first four). Throws
// std::invalid_argument when requested sizes do not fit the device.
Fa1Plan fa1_plan(const AttentionProblem& p, std::size_t smem_per_block_bytes, int sm_count);

Backend cuda_fa1_backend();

}  // namespace flashattn::cuda
