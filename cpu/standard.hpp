// cpu/standard.hpp — standard attention (the paper's Algorithm 0) with Eigen.
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

}  // namespace flashattn
