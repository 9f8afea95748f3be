// cpu/scalar.hpp — FlashAttention, Algorithm 1 of the paper, line by line, in plain loops.
//
// The form a learner steps through in a debugger beside the paper: the loop over K/V blocks j is
// outside, the loop over Q blocks i inside; O, l and m live in full-size arrays that stand for
// HBM; K_j, V_j, Q_i, O_i, l_i, m_i and S_ij are copied into small local buffers that stand for
// SRAM, sized from M as line 1 says. No Eigen, no OpenMP, no vector intrinsics.
#pragma once

#include <cstdint>
#include <functional>

#include "common/backend.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"

namespace flashattn {

// What Algorithm 1 line 1 chose for a problem, and how many floats its "SRAM" buffers take.
struct ScalarPlan {
    std::int64_t M = 0;           // SRAM size in floats (0 when block sizes were given directly)
    BlockSizes blocks;            // Br, Bc, at most N_q and N_kv
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

// One (j, i) step of Algorithm 1 as an observer sees it: which tiles, and the "SRAM" buffers.
// Tile indices are 0-based (the paper counts from 1). The buffers are sized for full tiles: rows
// r < rows.size() and columns c < cols.size() are valid; row r of S_ij starts at r * Bc, row r
// of Q_i and O_i at r * d, row c of K_j and V_j at c * d.
struct ScalarStep {
    std::int64_t batch = 0, head = 0;
    std::int64_t j = 0, i = 0;   // K/V tile j (outer loop, line 5), Q tile i (inner loop, line 7)
    TileRange rows, cols;        // query rows of Q_i, O_i, l_i, m_i; key rows of K_j, V_j
    std::int64_t d = 0, Bc = 0;  // row lengths of Q_i/O_i and of S_ij
    const float *Q_i = nullptr, *K_j = nullptr, *V_j = nullptr, *S_ij = nullptr;
    const float *m_tilde = nullptr, *l_tilde = nullptr, *m_i = nullptr, *l_i = nullptr;
    const float* O_i = nullptr;
};

// Optional observer of scalar_attention, for step-through examples (examples/02_algorithm1_trace).
// Each hook is called once per visited (j, i) tile; without an observer the cost is one pointer
// test per tile.
class ScalarTrace {
public:
    virtual ~ScalarTrace() = default;
    // After line 9: S_ij holds the scaled scores (masked keys -inf); m_i, l_i, O_i are the values
    // loaded at line 8, i.e. from before this step.
    virtual void after_scores(const ScalarStep&) {}
    // After line 13: S_ij now holds P_tilde (line 10 overwrites it in place), m_tilde and l_tilde
    // are set, m_i and l_i hold m_new and l_new, and O_i is the new O_i just written to HBM.
    virtual void after_update(const ScalarStep&) {}
};

// O: (batch, heads, seq_q, dim); lse: (batch, heads, seq_q) or nullptr; io: nullptr or a counter;
// trace: nullptr or an observer.
void scalar_attention(const AttentionProblem& problem, const float* Q, const float* K,
                      const float* V, float* O, float* lse, IoCounter* io = nullptr,
                      ScalarTrace* trace = nullptr);

// ---------------------------------------------------------------------------------------------
// The backward pass: Algorithm 4 of the paper (Appendix B.4), line by line (cpu/scalar_backward.cpp,
// docs/algorithm4_walkthrough.md). The same block sizes as the forward (line 2 is Algorithm 1's
// line 1: scalar_plan). K/V blocks outer, Q blocks inner; dQ in "HBM" is read and written at every
// step (line 21), dK_j and dV_j are accumulated on chip and written once per j (line 24).

// One (j, i) step of Algorithm 4 as an observer sees it, after line 22 (j, i counted from 0; the
// paper's j + 1, i + 1). Row r of P_ij, dP_ij and dS_ij starts at r * Bc (masked entries 0); row c of dK_j, dV_j (the on-chip accumulators, in double)
// at c * d; row r of dQ_i (just written to HBM) at r * d.
struct ScalarBackwardStep {
    std::int64_t batch = 0, head = 0;
    std::int64_t j = 0, i = 0;
    TileRange rows, cols;
    std::int64_t d = 0, Bc = 0;
    float tau = 0;  // the softmax scale (S = tau Q K^T)
    const float *P_ij = nullptr, *dP_ij = nullptr, *dS_ij = nullptr, *D_i = nullptr;
    const double *dK_j = nullptr, *dV_j = nullptr, *dQ_i = nullptr;
};
using ScalarBackwardTrace = std::function<void(const ScalarBackwardStep&)>;

// dQ: shape of Q; dK, dV: shape of K and V (summed over the query heads of a GQA group). Reads
// Q, K, V, the forward's O and LSE, and dO. io counts the "HBM" accesses (Q, K, V, O, dO, L, dQ,
// dK, dV); trace (may be empty) observes every visited step.
void scalar_backward(const AttentionProblem& problem, const BackwardInputs& in, float* dQ,
                     float* dK, float* dV, IoCounter* io = nullptr,
                     const ScalarBackwardTrace& trace = {});

}  // namespace flashattn
