// examples/counted_standard.hpp — standard attention (the paper's Algorithm 0) in plain loops, with
// its HBM accesses counted, for the IO comparison of Theorem 2 (examples/04_io_counting.cpp,
// docs/io_complexity.md).
//
// The counting model is the one cpu/scalar.cpp counts Algorithm 1 in (IoCounter): arrays Q, K, V,
// S, P, O stand for HBM, a buffer of at most M floats stands for SRAM, and an element counts once
// each time it moves between the two. Algorithm 0 with the same M:
//   line 1  S = Q K^T, written to HBM: for each block of b rows of Q, for each block of b rows of
//           K, one b x b tile of S. SRAM holds Q's block, K's block and the tile: 2bd + b^2 <= M.
//   line 2  P = softmax(S), written to HBM, row by row. A row of N scores may not fit in SRAM, so
//           it is streamed three times: its maximum, its sum of exponentials, then P's row.
//   line 3  O = P V, written to HBM: for each block of b rows of O (kept in SRAM), the b x b
//           blocks of P and b x d blocks of V it needs (same budget: 2bd + b^2 <= M).
// Reads Nd + N^2 d/b for S, 3N^2 for P, N^2 + N^2 d/b for O; writes 2N^2 + Nd: Theta(Nd + N^2)
// as Theorem 2 says when b >= d, i.e. when M >= 3d^2 (the paper's "d^2 much smaller than M").
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "cpu/scalar.hpp"

namespace flashattn::examples {

// The side b of the square tiles of S and P that fit in M floats with their Q/K (or V) rows.
std::int64_t standard_tile_size(std::int64_t M, std::int64_t d);

// One (batch, head), no masks: Q (N_q, d), K and V (N_kv, d), O (N_q, d). M is the SRAM size in
// floats (at least 4d, as for Algorithm 1). Adds the HBM element reads and writes to `io`.
// Throws std::invalid_argument for B*H > 1, a mask, or M < 4d.
void counted_standard_attention(const AttentionProblem& p, const float* Q, const float* K,
                                const float* V, float* O, std::int64_t M, IoCounter& io);

}  // namespace flashattn::examples
