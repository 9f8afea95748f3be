// cuda/standard/stages.cuh — the pieces cuda-standard's forward (cuda/standard/backend.cu) and
// backward (cuda/standard/backward.cu) share: the softmax of Algorithm 0 line 2 (one warp per row
// of S, P written over it, and LSE), a cuBLAS handle in FP32 mode, and the int check of cuBLAS
// sizes.
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "cuda/host/check.hpp"
#include "cuda/stages/warp_softmax.cuh"

namespace flashattn::cuda::standard {

constexpr int kSoftmaxWarps = 8;  // rows per block of the softmax kernel

// Algorithm 0 line 2 for one row of S per warp: P = softmax(S) in place, and LSE.
static __global__ void softmax_rows_kernel(const AttentionProblem p, float* __restrict__ S,
                                    float* __restrict__ lse) {
    const int lane = threadIdx.x % 32;
    const std::int64_t row = std::int64_t{blockIdx.x} * kSoftmaxWarps + threadIdx.x / 32;
    if (row >= p.batch * p.heads * p.seq_q) return;  // whole warps leave together
    const std::int64_t i = row % p.seq_q;            // query index inside its (b, h)
    const bool masked = p.causal || p.block_mask.active();
    float* S_row = S + row * p.seq_kv;

    // The score of key j as Algorithm 0 sees it: masked keys are -inf.
    const auto score = [&](std::int64_t j) {
        const float s = S_row[j];
        return masked && !p.key_visible(i, j) ? neg_infinity() : s;
    };

    // m = max_j S_ij and l = sum_j exp(S_ij - m) in one pass: every key is a block of one element,
    // (m, l) = (s, 1), merged into the lane's running state (eqs. 17/18 of docs/online_softmax.md).
    SoftmaxState state;
    for (std::int64_t j = lane; j < p.seq_kv; j += 32) {
        const float s = score(j);
        const SoftmaxMerge merged = merge_softmax(state, {s, s == neg_infinity() ? 0.0f : 1.0f});
        state = {merged.m_new, merged.l_new};
    }
    state = warp_merge(state);

    for (std::int64_t j = lane; j < p.seq_kv; j += 32)
        S_row[j] = normalize_output(exp_shifted(score(j), state.m), state.l);  // P_ij
    if (lane == 0) lse[row] = log_sum_exp(state);
}

class CublasHandle {
public:
    CublasHandle() {
        FA_CUBLAS_CHECK(cublasCreate(&handle_));
        // No TF32: this is the float32 baseline.
        FA_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    }
    ~CublasHandle() { (void)cublasDestroy(handle_); }
    CublasHandle(const CublasHandle&) = delete;
    CublasHandle& operator=(const CublasHandle&) = delete;
    cublasHandle_t get() const { return handle_; }

private:
    cublasHandle_t handle_ = nullptr;
};

inline int checked_int(std::int64_t v, const char* what) {
    if (v > std::numeric_limits<int>::max())
        throw std::invalid_argument(std::string(what) + " = " + std::to_string(v) +
                                    ": too large for a cuBLAS dimension (2^31 - 1)");
    return static_cast<int>(v);
}

// Launches softmax_rows_kernel over every row of S (B*H*N_q rows of N_kv scores).
inline void launch_softmax_rows(const AttentionProblem& p, float* S, float* lse) {
    const std::int64_t rows = p.batch * p.heads * p.seq_q;
    const std::int64_t blocks = (rows + kSoftmaxWarps - 1) / kSoftmaxWarps;
    if (blocks > std::numeric_limits<int>::max())
        throw std::invalid_argument("batch*heads*seq_q = " + std::to_string(rows) +
                                    ": too many rows for one softmax launch");
    softmax_rows_kernel<<<static_cast<unsigned>(blocks), kSoftmaxWarps * 32>>>(p, S, lse);
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda::standard
