// cpu/scalar.hpp — FlashAttention, Algorithm 1 of the paper, line by line, in plain loops.
//
// The form a learner steps through in a debugger beside the paper: the loop over K/V blocks j is
// outside, the loop over Q blocks i inside; O, l and m live in full-size arrays that stand for
// HBM; K_j, V_j, Q_i, O_i, l_i, m_i and S_ij are copied into small local buffers that stand for
// SRAM, sized from M as line 1 says. No Eigen, no OpenMP, no vector intrinsics.
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "common/tiling.hpp"

namespace flashattn {

// What Algorithm 1 line 1 chose for a problem, and how many floats its "SRAM" buffers take.
struct ScalarPlan {
    std::int64_t M = 0;           // SRAM size in floats (0 when block sizes were given directly)
    BlockSizes blocks;            // Br, Bc
    std::int64_t Tr = 0, Tc = 0;  // number of Q tiles and K/V tiles (line 3)
    std::int64_t sram_floats = 0; // K_j, V_j, Q_i, O_i, l_i, m_i, S_ij together
};
ScalarPlan scalar_plan(const AttentionProblem& problem);

// Element reads and writes of the arrays that stand for HBM (Q, K, V, O, l, m), for the IO
// counting of Theorem 2 (examples/ and docs/io_complexity.md).
struct IoCounter {
    std::int64_t reads = 0;
    std::int64_t writes = 0;
};

// O: (batch, heads, seq_q, dim); lse: (batch, heads, seq_q) or nullptr; io: nullptr or a counter.
void scalar_attention(const AttentionProblem& problem, const float* Q, const float* K,
                      const float* V, float* O, float* lse, IoCounter* io = nullptr);

}  // namespace flashattn
