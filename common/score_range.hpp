// common/score_range.hpp — refuses a problem whose scores cannot be held in float32.
//
// Every form computes S_ij = scale · q_i · k_j in float32 (paper Algorithm 1 line 9). When all the
// visible scores of a row overflow to −∞ (a huge negative scale, or huge inputs), the online
// softmax sees m_i = −∞ and returns O = 0, LSE = −∞: exactly what a row with no visible key
// returns (docs/design.md, Numerics), so the overflow would look like a mask. Overflow to +∞ gives
// NaN instead. Neither can be told from a correct answer afterwards, so the problem is refused
// before any work, with a message that names the scale.
//
// The test is a bound, not the scores themselves (computing those is the attention):
// by Cauchy–Schwarz |q_i · k_j| ≤ ‖q_i‖ ‖k_j‖, so every score and every partial sum of a dot
// product is at most  max(1, |scale|) · max_i ‖q_i‖ · max_j ‖k_j‖.
// The factor max(1, ·) is there because some kernels form q·k first and scale it afterwards (the
// tensor-core kernels scale by |scale| log2 e inside exp2), so the unscaled product must fit too.
// The limit is half of float32's largest value: room for that log2 e ≈ 1.44 and for a difference
// s − m of two scores of opposite sign. A problem within it is computed correctly by every form
// (the largest score is finite, so m_i is finite and l_i ≥ 1). The bound can refuse a problem whose
// actual scores would have fit (large vectors that happen to be nearly orthogonal); such inputs
// are far outside what attention is used for, and the message says how to bring them into range.
//
// Rows holding a NaN or ±∞ are left out of the bound: a non-finite input is the caller's own value
// and propagates as standard attention propagates it (a NaN is never hidden).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/problem.hpp"

namespace flashattn {

// The largest score magnitude every form computes correctly (see above).
inline constexpr double kScoreLimit = std::numeric_limits<float>::max() / 2.0;

// The largest Euclidean norm over the finite rows of a (rows, dim) array, in float64 (a float32
// sum of squares would itself overflow long before the scores do).
inline double max_finite_row_norm(const float* X, std::int64_t rows, std::int64_t dim) {
    double largest = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
        double sum = 0;
        for (std::int64_t c = 0; c < dim; ++c) {
            const double x = X[r * dim + c];
            sum += x * x;
        }
        if (std::isfinite(sum)) largest = std::max(largest, std::sqrt(sum));
    }
    return largest;
}

// The bound above for the problem's scale and these inputs (host float32 arrays, shapes of
// problem.hpp).
inline double score_bound(const AttentionProblem& p, const float* Q, const float* K) {
    const double q = max_finite_row_norm(Q, p.batch * p.heads * p.seq_q, p.dim);
    const double k = max_finite_row_norm(K, p.batch * p.heads_kv * p.seq_kv, p.dim);
    const double scale = std::fabs(static_cast<double>(p.softmax_scale()));
    return std::max(1.0, scale) * q * k;
}

// Throws std::invalid_argument naming the scale when the bound exceeds kScoreLimit.
inline void require_representable_scores(const AttentionProblem& p, const float* Q,
                                         const float* K) {
    const double bound = score_bound(p, Q, K);
    if (bound <= kScoreLimit) return;
    // The shortest text that reads back as the same float ("-3e+38", not "-3.00000005e+38"),
    // with C's printf rather than std::to_chars, which crashed inside the Python module on the
    // GPU image (a libstdc++ other than the one it was compiled against).
    const float value = p.softmax_scale();
    char scale[32];
    for (int digits = 1; digits <= 9; ++digits) {
        std::snprintf(scale, sizeof scale, "%.*g", digits, double(value));
        if (std::strtof(scale, nullptr) == value) break;
    }
    std::ostringstream msg;
    msg.precision(3);
    msg << "scale = " << scale << ": the scores scale * q.k of these inputs can reach " << bound
        << " in magnitude (max(1, |scale|) * max|q_i| * max|k_j|), beyond what float32 holds "
        << "(limit " << kScoreLimit << "): they would overflow, and a row would read as fully "
        << "masked or NaN. Use a smaller |scale| or rescale Q and K";
    throw std::invalid_argument(msg.str());
}

}  // namespace flashattn
