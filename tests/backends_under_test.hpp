// tests/backends_under_test.hpp — how the variant, edge-case and validation suites reach every
// backend: a loop over available_backends(), so a backend merged later (omp, the CUDA forms) is
// covered without touching the tests.
//
// Two documented reasons let a case pass a backend by, and nothing else does:
//   * precision: each backend is tested in f32 where it has it (every CPU form), else in the
//     first dtype it lists (a tensor-core form that only has f16/bf16);
//   * a CUDA form may reject a head dimension or option it states as unsupported, with
//     std::invalid_argument (docs/design.md, Shapes and errors). The CPU forms must accept every valid problem (any
//     N >= 1, d in [1, 256]), so for them a rejection fails the test.
#pragma once

#include <string>
#include <vector>

#include "helpers.hpp"

namespace flashattn::test {

inline DType test_dtype(const Backend& b) {
    return b.supports(DType::f32) ? DType::f32 : b.dtypes.front();
}

// Whether the backend takes problem p at all (see above). Runs it once on zero inputs: a CUDA
// form may check its limits when it launches, not only in prepare().
inline bool backend_accepts(const Backend& b, const AttentionProblem& p) {
    if (b.device == "cpu") return true;
    const std::vector<float> q(p.q_elements(), 0.0f), kv(p.kv_elements(), 0.0f);
    std::vector<float> O(p.q_elements()), lse(p.lse_elements());
    try {
        run_backend(b, p, q.data(), kv.data(), kv.data(), O.data(), lse.data(), test_dtype(b));
    } catch (const std::invalid_argument& e) {
        WARN(b.name << " does not support " << describe(p) << ": " << e.what());
        return false;
    }
    return true;
}

}  // namespace flashattn::test
