// cpu/reference.cpp — see reference.hpp.
#include "cpu/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/standard.hpp"

namespace flashattn {

std::vector<float> random_normal(std::int64_t count, std::uint64_t seed, float stddev) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> dist(0.0f, stddev);
    std::vector<float> v(static_cast<std::size_t>(count));
    for (float& x : v) x = dist(gen);
    return v;
}

ProblemData random_problem_data(const AttentionProblem& p, std::uint64_t seed) {
    return {random_normal(p.q_elements(), seed), random_normal(p.kv_elements(), seed + 1),
            random_normal(p.kv_elements(), seed + 2)};
}

namespace {
template <class T>
double max_abs_error_impl(const T* out, const double* ref, std::int64_t count) {
    double worst = 0;
    for (std::int64_t i = 0; i < count; ++i) {
        const double a = static_cast<double>(out[i]);
        const double r = ref[i];
        if (std::isnan(a) || std::isnan(r)) {
            if (std::isnan(a) != std::isnan(r)) return std::numeric_limits<double>::infinity();
            continue;
        }
        if (std::isinf(a) || std::isinf(r)) {
            if (a != r) return std::numeric_limits<double>::infinity();
            continue;
        }
        worst = std::max(worst, std::fabs(a - r));
    }
    return worst;
}
}  // namespace

double max_abs_error(const float* out, const double* ref, std::int64_t count) {
    return max_abs_error_impl(out, ref, count);
}
double max_abs_error(const double* out, const double* ref, std::int64_t count) {
    return max_abs_error_impl(out, ref, count);
}

Reference reference_attention(const AttentionProblem& p, const float* Q, const float* K,
                              const float* V) {
    Reference r;
    r.O.assign(static_cast<std::size_t>(p.q_elements()), 0.0);
    r.lse.assign(static_cast<std::size_t>(p.lse_elements()), 0.0);
    standard_attention<double>(p, Q, K, V, r.O.data(), r.lse.data());
    return r;
}

Baseline baseline_attention(const AttentionProblem& p, const ProblemData& in, DType dtype) {
    ProblemData rounded = in;
    round_to_dtype(rounded.Q, dtype);
    round_to_dtype(rounded.K, dtype);
    round_to_dtype(rounded.V, dtype);
    Baseline b;
    b.O.assign(static_cast<std::size_t>(p.q_elements()), 0.0f);
    b.lse.assign(static_cast<std::size_t>(p.lse_elements()), 0.0f);
    standard_attention<float>(p, rounded.Q.data(), rounded.K.data(), rounded.V.data(), b.O.data(),
                              b.lse.data());
    return b;
}

RuleBounds rule_bounds(const AttentionProblem& p, const ProblemData& in, const Reference& ref,
                       DType dtype) {
    const double eps = 1e-6;
    double lse_scale = 1;
    for (double x : ref.lse)
        if (std::isfinite(x)) lse_scale = std::max(lse_scale, std::fabs(x));
    const Baseline base = baseline_attention(p, in, dtype);
    return {2 * max_abs_error(base.O.data(), ref.O.data(), p.q_elements()) + eps,
            2 * max_abs_error(base.lse.data(), ref.lse.data(), p.lse_elements()) +
                eps * lse_scale};
}

GradReference reference_backward(const AttentionProblem& p, const float* Q, const float* K,
                                 const float* V, const float* dO) {
    GradReference r;
    r.dQ.assign(static_cast<std::size_t>(p.q_elements()), 0.0);
    r.dK.assign(static_cast<std::size_t>(p.kv_elements()), 0.0);
    r.dV.assign(static_cast<std::size_t>(p.kv_elements()), 0.0);
    standard_backward<double>(p, Q, K, V, dO, r.dQ.data(), r.dK.data(), r.dV.data());
    return r;
}

GradBaseline baseline_backward(const AttentionProblem& p, const ProblemData& in,
                               const std::vector<float>& dO, DType dtype) {
    ProblemData rounded = in;
    std::vector<float> dO_rounded = dO;
    round_to_dtype(rounded.Q, dtype);
    round_to_dtype(rounded.K, dtype);
    round_to_dtype(rounded.V, dtype);
    round_to_dtype(dO_rounded, dtype);
    GradBaseline b;
    b.dQ.assign(static_cast<std::size_t>(p.q_elements()), 0.0f);
    b.dK.assign(static_cast<std::size_t>(p.kv_elements()), 0.0f);
    b.dV.assign(static_cast<std::size_t>(p.kv_elements()), 0.0f);
    standard_backward<float>(p, rounded.Q.data(), rounded.K.data(), rounded.V.data(),
                             dO_rounded.data(), b.dQ.data(), b.dK.data(), b.dV.data());
    return b;
}

GradBounds gradient_bounds(const AttentionProblem& p, const ProblemData& in,
                           const std::vector<float>& dO, const GradReference& ref, DType dtype) {
    const GradBaseline base = baseline_backward(p, in, dO, dtype);
    double size = 1;
    for (const std::vector<double>* g : {&ref.dQ, &ref.dK, &ref.dV})
        for (double x : *g)
            if (std::isfinite(x)) size = std::max(size, std::fabs(x));
    // FlashAttention's own gradient rule: a factor of 3 in fp16/bf16 (their kernels round P and dS
    // to 16 bits before the products, which this yardstick, float32 on rounded inputs, does not),
    // 2 in float32.
    const double factor = dtype == DType::f32 ? 2 : 3;
    const auto bound = [size, factor](const std::vector<float>& b, const std::vector<double>& r) {
        return factor * max_abs_error(b.data(), r.data(), std::int64_t(r.size())) + 1e-6 * size;
    };
    return {bound(base.dQ, ref.dQ), bound(base.dK, ref.dK), bound(base.dV, ref.dV)};
}

}  // namespace flashattn
