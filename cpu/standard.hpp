// cpu/standard.hpp — standard attention (the paper's Algorithm 0) and its backward pass
// (Algorithm 3, Appendix B.2) with Eigen.
//
//   S = scale * Q K^T      (N_q x N_kv, materialized)
//   P = softmax(S)         (row-wise, masked keys get probability 0)
//   O = P V,  LSE = log(sum_j exp(S_ij))
//
// In double precision this is the reference every test compares against. In float it is the
// `standard` backend and the fair opponent of the flash forms in `flashattn bench`: Eigen GEMMs,
// vectorized softmax, OpenMP over (batch, head).
#pragma once

#include "common/problem.hpp"

namespace flashattn {

// Inputs are float32 (the library's storage type); Real is the precision of every operation and
// of the outputs. lse may be nullptr. Throws std::invalid_argument for an invalid problem.
template <class Real>
void standard_attention(const AttentionProblem& problem, const float* Q, const float* K,
                        const float* V, Real* O, Real* lse);

extern template void standard_attention<float>(const AttentionProblem&, const float*, const float*,
                                               const float*, float*, float*);
extern template void standard_attention<double>(const AttentionProblem&, const float*,
                                                const float*, const float*, double*, double*);

// The gradients dQ, dK, dV of a loss with gradient dO = dLoss/dO, by the paper's Algorithm 3: P
// and dP are materialized (2 N_q N_kv Reals per head being worked on), the N^2 memory the flash
// backward avoids. P is recomputed from Q and K (no O or LSE is read). dK, dV are summed over the
// query heads of a GQA group. In double it is the gradients' reference (cpu/reference.hpp), itself
// checked by finite differences (tests/test_backward.cpp). Throws std::invalid_argument for an
// invalid problem.
template <class Real>
void standard_backward(const AttentionProblem& problem, const float* Q, const float* K,
                       const float* V, const float* dO, Real* dQ, Real* dK, Real* dV);

extern template void standard_backward<float>(const AttentionProblem&, const float*, const float*,
                                              const float*, const float*, float*, float*, float*);
extern template void standard_backward<double>(const AttentionProblem&, const float*,
                                               const float*, const float*, const float*, double*,
                                               double*, double*);

}  // namespace flashattn
