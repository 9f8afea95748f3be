// examples/flashattn/gemm_ceiling.hpp — the machine's SGEMM rate, for `flashattn bench
// --gemm-ceiling`.
//
// Attention is two GEMMs and a softmax, so a CPU form's GFLOP/s is best judged against what a
// tuned SGEMM reaches on the same cores with the same threads: Eigen's C = A B, 2048^3, float32.
#pragma once

#include <memory>

namespace flashattn::cli {

class SgemmCeiling {
public:
    static constexpr long kSize = 2048;
    // Allocates A, B (random) and C: 3 * 16 MiB.
    SgemmCeiling();
    ~SgemmCeiling();
    // One C = A B with Eigen's current thread count (Eigen::setNbThreads / omp_set_num_threads).
    void run();
    static double flops() { return 2.0 * kSize * kSize * kSize; }

private:
    struct Matrices;
    std::unique_ptr<Matrices> m_;
};

}  // namespace flashattn::cli
