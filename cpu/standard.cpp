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

// One (batch, head) pair: S, P and O of Algorithm 0. S_buffer holds N_q x N_kv Reals.
template <class Real>
void attend_one_head(const AttentionProblem& p, Eigen::Ref<const Matrix<Real>> Qh,
                     Eigen::Ref<const Matrix<Real>> Kh, Eigen::Ref<const Matrix<Real>> Vh,
                     Real* S_buffer, Real* O, Real* lse) {
    const Real inf = std::numeric_limits<Real>::infinity();
    const Real scale = static_cast<Real>(p.softmax_scale());
    MatrixMap<Real> S(S_buffer, p.seq_q, p.seq_kv);

    // Algorithm 0 line 1: S = QK^T (scaled inside the GEMM, no extra pass over S), then the masks.
    S.noalias() = scale * (Qh * Kh.transpose());
    if (has_mask(p))
        for (std::int64_t i = 0; i < p.seq_q; ++i)
            for (std::int64_t j = 0; j < p.seq_kv; ++j)
                if (!p.key_visible(i, j)) S(i, j) = -inf;

    // Algorithm 0 line 2: P = softmax(S), in place, row by row.
    WorkBuffer<Real> row_sum(static_cast<std::size_t>(p.seq_q));
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

    // Algorithm 0 line 3: O = PV. A masked key is absent from the sum, not "0 times V_j": with
    // a NaN or inf in V_j, 0 * V_j would leak into rows that never attend key j. So rows of V
    // with a non-finite entry are zeroed for the GEMM and added back only where visible.
    MatrixMap<Real> Oh(O, p.seq_q, p.dim);
    std::vector<std::int64_t> bad_rows;
    if (has_mask(p))
        for (std::int64_t j = 0; j < p.seq_kv; ++j)
            if (!Vh.row(j).allFinite()) bad_rows.push_back(j);
    if (bad_rows.empty()) {
        Oh.noalias() = S * Vh;
    } else {
        Matrix<Real> V_clean = Vh;
        for (std::int64_t j : bad_rows) V_clean.row(j).setZero();
        Oh.noalias() = S * V_clean;
        for (std::int64_t j : bad_rows)
            for (std::int64_t i = 0; i < p.seq_q; ++i)
                if (p.key_visible(i, j)) Oh.row(i) += S(i, j) * Vh.row(j);
    }
    for (std::int64_t i = 0; i < p.seq_q; ++i)
        if (row_sum[i] != Real(0)) Oh.row(i) /= row_sum[i];
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
        WorkBuffer<Real> S(static_cast<std::size_t>(work_elements(p.seq_q, p.seq_kv)));
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
template void standard_attention<double>(const AttentionProblem&, const float*, const float*,
                                         const float*, double*, double*);

}  // namespace flashattn
