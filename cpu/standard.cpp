// cpu/standard.cpp — Algorithm 0 with Eigen; see standard.hpp.
#include "cpu/standard.hpp"

#include <Eigen/Dense>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "common/memory.hpp"
#include "cpu/parallel.hpp"
#include "cpu/vector_softmax.hpp"
#include "cpu/workspace.hpp"

namespace flashattn {
namespace {

template <class Real>
using Matrix = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Real>
using MatrixMap = Eigen::Map<Matrix<Real>>;
using ConstFloatMap = Eigen::Map<const Matrix<float>>;

bool has_mask(const AttentionProblem& p) { return p.causal || p.block_mask.active(); }

// The two steps of a softmax row. In float (the `standard` backend, the opponent of the flash
// forms in `bench`) they are the vectorized row forms of cpu/vector_softmax.hpp, as the omp form
// uses; in double (the reference every test compares against) they stay plain loops and
// std::exp, independent of the code under test.
float max_of_row(const float* row, std::int64_t n) { return row_max(row, n); }
double max_of_row(const double* row, std::int64_t n) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < n; ++j) {
        if (row[j] != row[j]) return row[j];  // NaN in the row: the whole row becomes NaN
        if (row[j] > m) m = row[j];
    }
    return m;
}
// row <- exp(row - m), with a masked score (-inf) giving 0; returns the row sum.
float exp_of_row(float* row, std::int64_t n, float m) { return exp_shifted_row(row, n, m); }
double exp_of_row(double* row, std::int64_t n, double m) {
    double sum = 0;
    for (std::int64_t j = 0; j < n; ++j) {
        row[j] = row[j] == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(row[j] - m);
        sum += row[j];
    }
    return sum;
}

// Out = A B where A (rows x n) is zero wherever visible(r, c) is false. A masked pair is absent
// from the sum, not "0 times B's row": with a NaN or inf in row c of B, 0 * B_c would leak into
// rows of Out that never read it (docs/design.md, Numerics). So rows of B with a non-finite entry
// are zeroed for the GEMM and added back only where visible.
// A and B may be any Eigen expressions (a transpose is not copied).
template <class Real, class MatA, class MatB, class Visible>
void masked_product(const AttentionProblem& p, const MatA& A, const MatB& B, MatrixMap<Real> Out,
                    Visible visible) {
    std::vector<std::int64_t> bad_rows;
    if (has_mask(p))
        for (std::int64_t c = 0; c < B.rows(); ++c)
            if (!B.row(c).allFinite()) bad_rows.push_back(c);
    if (bad_rows.empty()) {
        Out.noalias() = A * B;
        return;
    }
    Matrix<Real> B_clean = B;  // rare: only a masked problem with a non-finite input
    for (std::int64_t c : bad_rows) B_clean.row(c).setZero();
    Out.noalias() = A * B_clean;
    for (std::int64_t c : bad_rows)
        for (std::int64_t r = 0; r < A.rows(); ++r)
            if (visible(r, c)) Out.row(r) += A(r, c) * B.row(c);
}

// Algorithm 0 lines 1-2 for one (batch, head) pair: S = scale Q K^T with the masks (-inf), then
// each row of S turned in place into exp(S - rowmax), its sum in row_sum (0 for a row with no
// visible key, whose row is then all zeros) and, if lse is given, LSE = m + log(row_sum).
template <class Real>
void softmax_scores(const AttentionProblem& p, Eigen::Ref<const Matrix<Real>> Qh,
                    Eigen::Ref<const Matrix<Real>> Kh, MatrixMap<Real> S, Real* row_sum,
                    Real* lse) {
    const Real inf = std::numeric_limits<Real>::infinity();
    const Real scale = static_cast<Real>(p.softmax_scale());
    // Line 1: S = QK^T (scaled inside the GEMM, no extra pass over S), then the masks.
    S.noalias() = scale * (Qh * Kh.transpose());
    if (has_mask(p))
        for (std::int64_t i = 0; i < p.seq_q; ++i)
            for (std::int64_t j = 0; j < p.seq_kv; ++j)
                if (!p.key_visible(i, j)) S(i, j) = -inf;
    // Line 2: P = softmax(S), in place, row by row (the division by row_sum left to the caller).
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
        Real* row = &S(i, 0);
        const Real m = max_of_row(row, p.seq_kv);
        if (m == -inf) {  // no visible key: P row = 0, O row = 0, LSE = -inf
            S.row(i).setZero();
            row_sum[i] = 0;
            if (lse) lse[i] = -inf;
            continue;
        }
        row_sum[i] = exp_of_row(row, p.seq_kv, m);
        if (lse) lse[i] = m + std::log(row_sum[i]);
    }
}

// One (batch, head) pair: S, P and O of Algorithm 0. S_buffer holds N_q x N_kv Reals.
template <class Real>
void attend_one_head(const AttentionProblem& p, Eigen::Ref<const Matrix<Real>> Qh,
                     Eigen::Ref<const Matrix<Real>> Kh, Eigen::Ref<const Matrix<Real>> Vh,
                     Real* S_buffer, Real* O, Real* lse) {
    MatrixMap<Real> S(S_buffer, p.seq_q, p.seq_kv);
    WorkBuffer<Real> row_sum(static_cast<std::size_t>(p.seq_q), "standard attention's row sums");
    softmax_scores<Real>(p, Qh, Kh, S, row_sum.data(), lse);

    // Algorithm 0 line 3: O = PV, masked keys absent from the sum (masked_product).
    MatrixMap<Real> Oh(O, p.seq_q, p.dim);
    masked_product<Real>(p, S, Vh, Oh, [&](std::int64_t i, std::int64_t j) {
        return p.key_visible(i, j);
    });
    for (std::int64_t i = 0; i < p.seq_q; ++i)
        if (row_sum[i] != Real(0)) Oh.row(i) /= row_sum[i];
}

// The gradients of one (batch, head) pair, the paper's Algorithm 3 (standard attention backward,
// Appendix B.2): P and dP are N_q x N_kv matrices in memory. P is recomputed here from Q and K (the
// interface keeps no P between the passes), which costs one GEMM and the softmax. dK and dV of
// this query head are written to dK_h, dV_h (N_kv x d); the caller sums a GQA group.
// P_buffer and dP_buffer hold N_q x N_kv Reals.
template <class Real>
void backward_one_head(const AttentionProblem& p, Eigen::Ref<const Matrix<Real>> Qh,
                       Eigen::Ref<const Matrix<Real>> Kh, Eigen::Ref<const Matrix<Real>> Vh,
                       Eigen::Ref<const Matrix<Real>> dOh, Real* P_buffer, Real* dP_buffer,
                       Real* dQ, Real* dK_h, Real* dV_h) {
    const Real scale = static_cast<Real>(p.softmax_scale());
    const auto visible = [&](std::int64_t i, std::int64_t j) { return p.key_visible(i, j); };
    const auto visible_transposed = [&](std::int64_t j, std::int64_t i) { return visible(i, j); };
    MatrixMap<Real> P(P_buffer, p.seq_q, p.seq_kv), dP(dP_buffer, p.seq_q, p.seq_kv);
    WorkBuffer<Real> row_sum(static_cast<std::size_t>(p.seq_q), "standard attention's row sums");
    softmax_scores<Real>(p, Qh, Kh, P, row_sum.data(), nullptr);
    for (std::int64_t i = 0; i < p.seq_q; ++i)
        if (row_sum[i] != Real(0)) P.row(i) /= row_sum[i];

    // Algorithm 3 line 1: dV = P^T dO (masked pairs absent, as in the forward's PV).
    masked_product<Real>(p, P.transpose(), dOh, MatrixMap<Real>(dV_h, p.seq_kv, p.dim),
                         visible_transposed);
    // Line 2: dP = dO V^T. A masked entry may hold anything (V's NaN): line 3 never reads it.
    dP.noalias() = dOh * Vh.transpose();
    // Line 3: dS_ij = P_ij (dP_ij - sum_l P_il dP_il), in place of dP; masked entries 0. The sum
    // is Algorithm 3's own; the flash forms use the equal D_i = rowsum(dO_i o O_i)
    // (common/backward.hpp).
    if (!has_mask(p)) {
        const auto D = (P.array() * dP.array()).rowwise().sum().eval();
        dP.array() = P.array() * (dP.array().colwise() - D);
    } else {
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
            Real D = 0;
            for (std::int64_t j = 0; j < p.seq_kv; ++j)
                if (visible(i, j)) D += P(i, j) * dP(i, j);
            for (std::int64_t j = 0; j < p.seq_kv; ++j)
                dP(i, j) = visible(i, j) ? P(i, j) * (dP(i, j) - D) : Real(0);
        }
    }
    // Lines 4-5: dQ = scale dS K, dK = scale dS^T Q (masked pairs absent).
    MatrixMap<Real> dQh(dQ, p.seq_q, p.dim), dKh(dK_h, p.seq_kv, p.dim);
    masked_product<Real>(p, dP, Kh, dQh, visible);
    masked_product<Real>(p, dP.transpose(), Qh, dKh, visible_transposed);
    dQh *= scale;
    dKh *= scale;
}

}  // namespace

template <class Real>
void standard_attention(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                        Real* O, Real* lse) {
    validate(p);
    require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V"), require_array(O, "O");
    const std::int64_t pairs = p.batch * p.heads;
    // S of Algorithm 0 is N_q x N_kv per (batch, head) pair, one per thread at a time: the O(N^2)
    // memory that FlashAttention removes, and the first thing to run out for long sequences.
    const double concurrent = double(std::min<std::int64_t>(pairs, omp_get_max_threads()));
    require_memory(concurrent * double(p.seq_q) * double(p.seq_kv) * sizeof(Real),
                   "standard attention's S = QK^T (" + std::to_string(p.seq_q) + " x " +
                       std::to_string(p.seq_kv) + " per head)");
    // Parallel over (batch, head); Eigen's GEMM runs single-threaded inside a parallel region,
    // and with all threads when there is only one pair.
    parallel_for(pairs, [&](std::int64_t bh) {
        const std::int64_t b = bh / p.heads;
        const std::int64_t h = bh % p.heads;
        WorkBuffer<Real> S(static_cast<std::size_t>(work_elements(p.seq_q, p.seq_kv)),
                           "standard attention's S = QK^T");
        const ConstFloatMap Qf(Q + p.q_offset(b, h), p.seq_q, p.dim);
        const ConstFloatMap Kf(K + p.kv_offset(b, h), p.seq_kv, p.dim);
        const ConstFloatMap Vf(V + p.kv_offset(b, h), p.seq_kv, p.dim);
        Real* O_h = O + p.q_offset(b, h);
        Real* lse_h = lse ? lse + p.lse_offset(b, h) : nullptr;
        if constexpr (std::is_same_v<Real, float>) {
            attend_one_head<Real>(p, Qf, Kf, Vf, S.data(), O_h, lse_h);  // no copies in float
        } else {
            attend_one_head<Real>(p, Qf.cast<Real>(), Kf.cast<Real>(), Vf.cast<Real>(), S.data(),
                                  O_h, lse_h);
        }
    });
}

template void standard_attention<float>(const AttentionProblem&, const float*, const float*,
                                        const float*, float*, float*);

template <class Real>
void standard_backward(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                       const float* dO, Real* dQ, Real* dK, Real* dV) {
    validate(p);
    require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V"), require_array(dO, "dO");
    require_array(dQ, "dQ"), require_array(dK, "dK"), require_array(dV, "dV");
    // Parallel over (batch, K/V head): the query heads of a GQA group run one after another on
    // one thread and add their dK, dV in a fixed order, so no two threads write the same rows.
    const std::int64_t groups = p.batch * p.heads_kv, G = p.group_size();
    const double concurrent = double(std::min<std::int64_t>(groups, omp_get_max_threads()));
    require_memory(concurrent * 2 * double(p.seq_q) * double(p.seq_kv) * sizeof(Real),
                   "standard attention's backward P and dP (2 x " + std::to_string(p.seq_q) +
                       " x " + std::to_string(p.seq_kv) + " per head)");
    const std::size_t kv_size = static_cast<std::size_t>(p.seq_kv * p.dim);
    // P and dP once per thread, not per group: fresh N^2 buffers for every head would spend much
    // of the time in the kernel's page faults, which would make this opponent look slower than
    // Algorithm 3 is.
    struct Buffers {
        WorkBuffer<Real> P, dP, dK_h, dV_h;
    };
    const auto make_buffers = [&] {
        const auto n = static_cast<std::size_t>(work_elements(p.seq_q, p.seq_kv));
        return Buffers{WorkBuffer<Real>(n, "standard attention's backward P"),
                       WorkBuffer<Real>(n, "standard attention's backward dP"),
                       WorkBuffer<Real>(kv_size, "standard attention's backward dK of one head"),
                       WorkBuffer<Real>(kv_size, "standard attention's backward dV of one head")};
    };
    const auto one_group = [&](Buffers& buf, std::int64_t bg) {
        const std::int64_t b = bg / p.heads_kv, g = bg % p.heads_kv;
        Real* dK_g = dK + p.kv_offset(b, g * G);
        Real* dV_g = dV + p.kv_offset(b, g * G);
        std::fill(dK_g, dK_g + kv_size, Real(0));
        std::fill(dV_g, dV_g + kv_size, Real(0));
        for (std::int64_t h = g * G; h < (g + 1) * G; ++h) {
            const ConstFloatMap Qf(Q + p.q_offset(b, h), p.seq_q, p.dim);
            const ConstFloatMap Kf(K + p.kv_offset(b, h), p.seq_kv, p.dim);
            const ConstFloatMap Vf(V + p.kv_offset(b, h), p.seq_kv, p.dim);
            const ConstFloatMap dOf(dO + p.q_offset(b, h), p.seq_q, p.dim);
            Real* dQ_h = dQ + p.q_offset(b, h);
            if constexpr (std::is_same_v<Real, float>) {
                backward_one_head<Real>(p, Qf, Kf, Vf, dOf, buf.P.data(), buf.dP.data(), dQ_h,
                                        buf.dK_h.data(), buf.dV_h.data());
            } else {
                backward_one_head<Real>(p, Qf.cast<Real>(), Kf.cast<Real>(), Vf.cast<Real>(),
                                        dOf.cast<Real>(), buf.P.data(), buf.dP.data(), dQ_h,
                                        buf.dK_h.data(), buf.dV_h.data());
            }
            for (std::size_t e = 0; e < kv_size; ++e)
                dK_g[e] += buf.dK_h[e], dV_g[e] += buf.dV_h[e];
        }
    };
    if (groups == 1) {  // one group: outside a parallel region, so Eigen's GEMMs use every thread
        Buffers buf = make_buffers();
        one_group(buf, 0);
    } else {
        parallel_for_with_state(groups, make_buffers, one_group);
    }
}

template void standard_backward<float>(const AttentionProblem&, const float*, const float*,
                                       const float*, const float*, float*, float*, float*);
template void standard_backward<double>(const AttentionProblem&, const float*, const float*,
                                        const float*, const float*, double*, double*, double*);
template void standard_attention<double>(const AttentionProblem&, const float*, const float*,
                                         const float*, double*, double*);

}  // namespace flashattn
