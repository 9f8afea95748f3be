// cpu/reference.hpp — what every check of a backend compares against: standard attention in
// float64, the same-precision baseline, and the accuracy rule (docs/design.md, "Correctness
// rule"). Used by the tests, `flashattn demo`, and the learning examples.
//
// The rule, from FlashAttention's own test suite: with ref64 = standard attention in float64 and
// std_p = standard attention in the backend's precision p on the same (p-rounded) inputs,
//     max|out - ref64| <= 2 * max|std_p - ref64| + eps          (eps = 1e-6 for float32).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "common/dtype.hpp"
#include "common/problem.hpp"

namespace flashattn {

// Standard-normal values from a seeded generator (deterministic per seed).
std::vector<float> random_normal(std::int64_t count, std::uint64_t seed, float stddev = 1.0f);

struct ProblemData {
    std::vector<float> Q, K, V;
};
ProblemData random_problem_data(const AttentionProblem& p, std::uint64_t seed);

// The largest |a - ref| where both are finite or both NaN-free; a NaN in `out` where `ref` is
// not NaN (or the reverse), or an infinity mismatch, counts as an infinite error.
double max_abs_error(const float* out, const double* ref, std::int64_t count);
double max_abs_error(const double* out, const double* ref, std::int64_t count);

// The float64 reference, in O and LSE arrays sized for p.
struct Reference {
    std::vector<double> O, lse;
};
Reference reference_attention(const AttentionProblem& p, const float* Q, const float* K,
                              const float* V);

// The baseline of the rule: standard attention in float32 arithmetic on the inputs rounded to
// `dtype` (for f16/bf16 the rounding is the only precision loss the backend is not blamed for).
struct Baseline {
    std::vector<float> O, lse;
};
Baseline baseline_attention(const AttentionProblem& p, const ProblemData& in, DType dtype);

// The rule's bounds for one problem: 2 * max|std_p - ref64| + eps, for O and for LSE. O is a
// weighted mean of V (order 1), so its eps is absolute; LSE grows like the largest score + log N
// and one float32 rounding of it is relative, so its eps is scaled by its magnitude.
struct RuleBounds {
    double O = 0, lse = 0;
};
RuleBounds rule_bounds(const AttentionProblem& p, const ProblemData& in, const Reference& ref,
                       DType dtype);

// The error of one output against the reference and the rule's bound for it.
struct Accuracy {
    double error = 0;  // max|out - ref64|
    double bound = 0;  // 2 * max|std_p - ref64| + eps
    bool passed() const { return error <= bound; }
};

// The backward pass (docs/design.md, "Correctness rule", applied to each gradient): the float64
// reference is Algorithm 3 in double (cpu/standard.hpp), itself checked by central finite
// differences in tests/test_backward.cpp; the baseline is Algorithm 3 in float32 on the inputs
// rounded to `dtype` (Q, K, V and dO).
struct GradReference {
    std::vector<double> dQ, dK, dV;
};
GradReference reference_backward(const AttentionProblem& p, const float* Q, const float* K,
                                 const float* V, const float* dO);

struct GradBaseline {
    std::vector<float> dQ, dK, dV;
};
GradBaseline baseline_backward(const AttentionProblem& p, const ProblemData& in,
                               const std::vector<float>& dO, DType dtype);

// factor * max|baseline - ref64| + eps for each gradient, factor 2 in float32 and 3 in fp16/bf16
// (FlashAttention's own gradient rule, docs/testing.md). The gradients' sizes grow with the scores
// and with N (dK_j, dV_j sum over query rows), so eps = 1e-6 is scaled by the largest |value| of
// the three: where one gradient is zero by cancellation (N_kv = 1 gives dS = dP - D = 0, which
// Algorithm 3 reproduces exactly and Algorithm 4, with D = rowsum(dO o O), to the rounding of
// dP), its error is a rounding of the backward's other quantities, not of itself.
struct GradBounds {
    double dQ = 0, dK = 0, dV = 0;
};
GradBounds gradient_bounds(const AttentionProblem& p, const ProblemData& in,
                           const std::vector<float>& dO, const GradReference& ref, DType dtype);

}  // namespace flashattn
