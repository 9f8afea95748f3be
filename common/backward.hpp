// common/backward.hpp — the backward pass's rule, written once for every form.
//
// FlashAttention §3.1 "Recomputation" and Appendix B.2 (arXiv 2205.14135): the forward keeps O and
// the softmax statistics of each row (here L_i = m_i + log l_i, the LSE) instead of P, and the
// backward rebuilds each tile of P from S_ij = scale Q_i K_j^T and L_i. With dO = dLoss/dO:
//
//     P_ij  = exp(S_ij - L_i)               (= diag(l_i)^-1 exp(S_ij - m_i), Algorithm 4 line 13)
//     dV_j += P_ij^T dO_i                    (line 16)
//     dP_ij = dO_i V_j^T                     (line 17)
//     D_i   = rowsum(dO_i o O_i)             (line 19)
//     dS_ij = P_ij o (dP_ij - D_i)           (line 20)
//     dQ_i += scale dS_ij K_j                (line 21)
//     dK_j += scale dS_ij^T Q_i              (line 22)
//
// Why D_i is rowsum(dO_i o O_i): the softmax's gradient is dS_ij = P_ij (dP_ij - sum_l P_il dP_il)
// (Appendix B.2, eq. for dS), and sum_l P_il dP_il = sum_l P_il dO_i . V_l = dO_i . O_i, one dot
// product of length d instead of a sum over all N_kv keys; the flash forms can then compute dS_ij
// tile by tile. Standard attention (Algorithm 3) keeps P and dP whole and may sum P o dP directly.
//
// Masking: a masked key is absent from every sum, never "0 times" a value: a NaN or inf in K_j,
// V_j, Q_i or dO_i must reach only the gradients whose sums read it (a fully masked row reads
// nothing, so its dQ row is 0 and it adds nothing to dK and dV). The forms skip masked (i, j)
// pairs; the functions below are for the visible ones.
#pragma once

#include <cmath>

#include "common/config.hpp"
#include "common/online_softmax.hpp"

namespace flashattn {

// P_ij rebuilt from the score s = S_ij (scale applied) and the row's LSE L_i. A score that
// overflowed to -inf has weight 0; L_i = -inf only when no visible key carried weight, and then
// every P_ij of the row is 0 (not exp(-inf + inf) = NaN). A NaN in s or L gives NaN.
FA_HOST_DEVICE inline float recomputed_probability(float s, float lse) {
    if (s == -INFINITY || lse == -INFINITY) return 0.0f;
    return expf(s - lse);
}

// The fast form of recomputed_probability, for kernels that keep raw scores s = q.k (the scale
// not yet applied; c = |scale| log2(e), as exp2_shifted): exp(|scale| s - L) = 2^(s c - L log2 e).
// The shift L log2(e) is taken once per row by lse_shift; for L = -inf (a row with no visible key)
// it is +inf, so that every P of the row is 2^-inf = 0, never 2^(inf - inf). A score of -inf
// gives 0 and a NaN in s or L gives NaN, as above.
FA_HOST_DEVICE inline float lse_shift(float lse) {
    return lse == -INFINITY ? INFINITY : lse * kLog2e;
}
FA_HOST_DEVICE inline float recomputed_probability_exp2(float s, float shift, float scale_log2) {
    return fast_exp2(s * scale_log2 - shift);
}

// dS_ij = P_ij (dP_ij - D_i): the gradient of the loss with respect to the score S_ij.
FA_HOST_DEVICE inline float score_gradient(float P, float dP, float D) { return P * (dP - D); }

// D_i = rowsum(dO_i o O_i) for one row of d values, summed in double (a float chain of d terms
// would be the least accurate sum of the backward at large d).
template <class In>
FA_HOST_DEVICE inline float output_delta(const In* dO_row, const In* O_row, long long d) {
    double sum = 0.0;
    for (long long k = 0; k < d; ++k) sum += double(dO_row[k]) * double(O_row[k]);
    return static_cast<float>(sum);
}

}  // namespace flashattn
