// examples/flashattn/verify.hpp — random inputs and the correctness rule shared by the command
// line (demo, bench) and the tests.
//
// The rule (DESIGN.md, from FlashAttention's own test suite): with ref64 = standard attention in
// float64 and std_p = standard attention in the backend's precision p on the same inputs,
//     max|out - ref64| <= 2 * max|std_p - ref64| + eps          (eps = 1e-6 for float32).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

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

struct Accuracy {
    double error = 0;   // max|out - ref64|
    double bound = 0;   // 2 * max|std_p - ref64| + eps
    bool passed() const { return error <= bound; }
};

// The float64 reference, in O and LSE arrays sized for p.
struct Reference {
    std::vector<double> O, lse;
};
Reference reference_attention(const AttentionProblem& p, const float* Q, const float* K,
                              const float* V);

}  // namespace flashattn
