// cuda/standard/backward.cu — cuda-standard's backward: the paper's Algorithm 3 (standard attention
// backward, Appendix B.2) on the GPU, the baseline of the flash backwards.
//
//   recompute S = scale Q K^T and P = softmax(S)   cuBLAS SGEMM + the forward's softmax kernel
//   line 1: dV = P^T dO                             cuBLAS SGEMM
//   line 2: dP = dO V^T                             cuBLAS SGEMM, written to HBM (N_q x N_kv)
//   line 3: dS = P o (dP - rowsum(P o dP))          one warp per row, dS written over dP
//   line 4: dQ = scale dS K                         cuBLAS SGEMM
//   line 5: dK = scale dS^T Q                       cuBLAS SGEMM
//
// P and dP (then dS) are materialized: 2 B H N_q N_kv floats, reported by extra_bytes(). P is
// recomputed rather than read (the interface keeps nothing between the passes). Layout and GQA as
// in cuda/standard/backend.cu: a K/V head's g query heads form one (g N_q) x d matrix, so the GEMMs
// over it (k = g N_q for dK and dV) sum the group's contributions; row-major (r x c) is cuBLAS's
// column-major (c x r).
//
// Masked pairs are absent from every sum: dS is set to 0 there (line 3 never reads their dP, which
// V's NaN may have made NaN). The GEMMs still multiply a masked pair's 0 by Q, K or dO, and 0 * inf
// is NaN, so when a mask is active and one of those holds a non-finite value (checked once in
// prepare), lines 1, 4 and 5 run plain kernels that skip masked pairs instead.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>

#include "common/backward.hpp"
#include "common/memory.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/prepared_backward.hpp"
#include "cuda/standard/backend.hpp"
#include "cuda/standard/stages.cuh"

namespace flashattn::cuda {
namespace {

using standard::checked_int;
using standard::CublasHandle;
using standard::kSoftmaxWarps;

// Line 3 for one row of P and dP per warp: D = sum over visible keys of P dP, then dS in place.
__global__ void score_gradient_rows_kernel(const AttentionProblem p, const float* __restrict__ P,
                                           float* __restrict__ dP) {
    const int lane = threadIdx.x % 32;
    const std::int64_t row = std::int64_t{blockIdx.x} * kSoftmaxWarps + threadIdx.x / 32;
    if (row >= p.batch * p.heads * p.seq_q) return;
    const std::int64_t i = row % p.seq_q;
    const float* P_row = P + row * p.seq_kv;
    float* dP_row = dP + row * p.seq_kv;
    float D = 0.0f;
    for (std::int64_t j = lane; j < p.seq_kv; j += 32)
        if (p.key_visible(i, j)) D += P_row[j] * dP_row[j];
    for (int offset = 16; offset > 0; offset /= 2) D += __shfl_xor_sync(0xffffffffu, D, offset);
    for (std::int64_t j = lane; j < p.seq_kv; j += 32)
        dP_row[j] = p.key_visible(i, j) ? score_gradient(P_row[j], dP_row[j], D) : 0.0f;
}

// dQ_i = scale sum over the keys row i sees of dS_ij K_j, skipping masked pairs. One block per
// query row, threads over d.
__global__ void masked_query_gradient_kernel(const AttentionProblem p, const float* __restrict__ dS,
                                             const float* __restrict__ K, float* __restrict__ dQ) {
    const std::int64_t row = blockIdx.x, i = row % p.seq_q, bh = row / p.seq_q;
    const float* K_h = K + p.kv_offset(bh / p.heads, bh % p.heads);
    const float scale = p.softmax_scale();
    for (std::int64_t c = threadIdx.x; c < p.dim; c += blockDim.x) {
        float sum = 0.0f;
        for (std::int64_t j = 0; j < p.seq_kv; ++j)
            if (p.key_visible(i, j)) sum += dS[row * p.seq_kv + j] * K_h[j * p.dim + c];
        dQ[row * p.dim + c] = scale * sum;
    }
}

// out_j = alpha sum over the group's query rows i that see key j of A_ij X_i, skipping masked
// pairs: dV (A = P, X = dO, alpha = 1) and dK (A = dS, X = Q, alpha = scale). One block per key
// row of a K/V head, threads over d.
__global__ void masked_key_gradient_kernel(const AttentionProblem p, const float* __restrict__ A,
                                           const float* __restrict__ X, float alpha,
                                           float* __restrict__ out) {
    const std::int64_t key_row = blockIdx.x, j = key_row % p.seq_kv, bg = key_row / p.seq_kv;
    const std::int64_t b = bg / p.heads_kv, g = bg % p.heads_kv, G = p.group_size();
    for (std::int64_t c = threadIdx.x; c < p.dim; c += blockDim.x) {
        float sum = 0.0f;
        for (std::int64_t h = g * G; h < (g + 1) * G; ++h)
            for (std::int64_t i = 0; i < p.seq_q; ++i) {
                if (!p.key_visible(i, j)) continue;
                const std::int64_t row = (b * p.heads + h) * p.seq_q + i;
                sum += A[row * p.seq_kv + j] * X[row * p.dim + c];
            }
        out[key_row * p.dim + c] = alpha * sum;
    }
}

bool any_nonfinite(const float* x, std::int64_t n) {
    return std::any_of(x, x + n, [](float v) { return !std::isfinite(v); });
}

constexpr int kKeyChunk = 256;  // k per GEMM for d < 16 (see cuda/standard/backend.cu, line 3)

class PreparedStandardBackward final : public PreparedCudaBackward {
public:
    PreparedStandardBackward(const AttentionProblem& p, const BackwardInputs& in, DType dtype)
        : PreparedCudaBackward("cuda-standard", p, in, dtype) {
        const auto n = static_cast<std::size_t>(work_elements(p.batch * p.heads * p.seq_q, p.seq_kv));
        require_memory(2.0 * double(n) * sizeof(float),
                       "cuda-standard's backward P and dP (" + std::to_string(p.seq_q) + " x " +
                           std::to_string(p.seq_kv) + " per head, two of them)");
        P_ = workspace<float>(n);
        dP_ = workspace<float>(n);
        lse_recomputed_ = workspace<float>(static_cast<std::size_t>(p.lse_elements()));
        masked_nonfinite_ = (p.causal || p.block_mask.active()) &&
                            (any_nonfinite(in.Q, p.q_elements()) ||
                             any_nonfinite(in.K, p.kv_elements()) ||
                             any_nonfinite(in.dO, p.q_elements()));
    }

    void execute() override {
        const AttentionProblem& p = problem_;
        const int d = checked_int(p.dim, "dim");
        const int n_kv = checked_int(p.seq_kv, "seq_kv");
        const int R = checked_int(p.group_size() * p.seq_q, "(heads/heads_kv)*seq_q");
        const int kv_heads = checked_int(p.batch * p.heads_kv, "batch*heads_kv");
        const long long q_stride = static_cast<long long>(R) * d;
        const long long kv_stride = static_cast<long long>(n_kv) * d;
        const long long s_stride = static_cast<long long>(R) * n_kv;
        const float scale = p.softmax_scale(), one = 1.0f, zero = 0.0f;
        cublasHandle_t h = cublas_.get();

        // Recompute S^T = K Q^T (column-major N_kv x R) and P = softmax(S) in place.
        FA_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, n_kv, R, d, &scale,
                                                  K_.data(), d, kv_stride, Q_.data(), d, q_stride,
                                                  &zero, P_.data(), n_kv, s_stride, kv_heads));
        standard::launch_softmax_rows(p, P_.data(), lse_recomputed_.data());
        // Line 2: dP^T = V dO^T, the same shape as S^T.
        FA_CUBLAS_CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, n_kv, R, d, &one,
                                                  V_.data(), d, kv_stride, dO_.data(), d, q_stride,
                                                  &zero, dP_.data(), n_kv, s_stride, kv_heads));
        // Line 3: dS over dP.
        const std::int64_t rows = p.batch * p.heads * p.seq_q;
        const std::int64_t blocks = (rows + kSoftmaxWarps - 1) / kSoftmaxWarps;
        if (blocks > std::numeric_limits<int>::max() || rows > std::numeric_limits<int>::max())
            throw std::invalid_argument("batch*heads*seq_q = " + std::to_string(rows) +
                                        ": too many rows for one launch");
        score_gradient_rows_kernel<<<static_cast<unsigned>(blocks), kSoftmaxWarps * 32>>>(
            p, P_.data(), dP_.data());
        FA_CUDA_CHECK_LAUNCH();

        if (masked_nonfinite_) {
            masked_key_gradient_kernel<<<static_cast<unsigned>(p.batch * p.heads_kv * p.seq_kv),
                                         128>>>(p, P_.data(), dO_.data(), 1.0f, dV_.data());
            FA_CUDA_CHECK_LAUNCH();
            masked_key_gradient_kernel<<<static_cast<unsigned>(p.batch * p.heads_kv * p.seq_kv),
                                         128>>>(p, dP_.data(), Q_.data(), scale, dK_.data());
            FA_CUDA_CHECK_LAUNCH();
            masked_query_gradient_kernel<<<static_cast<unsigned>(rows), 128>>>(
                p, dP_.data(), K_.data(), dQ_.data());
            FA_CUDA_CHECK_LAUNCH();
            synchronize_device();
            return;
        }
        // C (d x n, column-major) = alpha A (d x k) op(B) (k x n), summed over k in chunks for
        // d < 16 (see kKeyChunk): a_step and b_step are how far A and B move per unit of k.
        const auto product = [&](cublasOperation_t op_b, int n, int k, float alpha, const float* A,
                                 long long a_stride, long long a_step, const float* B, int ldb,
                                 long long b_stride, long long b_step, float* C,
                                 long long c_stride) {
            const int chunk = d < 16 ? kKeyChunk : k;
            for (int k0 = 0; k0 < k; k0 += chunk) {
                const int kk = std::min(chunk, k - k0);
                FA_CUBLAS_CHECK(cublasSgemmStridedBatched(
                    h, CUBLAS_OP_N, op_b, d, n, kk, &alpha, A + k0 * a_step, d, a_stride,
                    B + k0 * b_step, ldb, b_stride, k0 == 0 ? &zero : &one, C, d, c_stride,
                    kv_heads));
            }
        };
        // Line 1: dV^T (d x N_kv) = dO^T (d x R) P (R x N_kv; P^T is what is stored).
        product(CUBLAS_OP_T, n_kv, R, 1.0f, dO_.data(), q_stride, d, P_.data(), n_kv, s_stride,
                n_kv, dV_.data(), kv_stride);
        // Line 4: dQ^T (d x R) = scale K^T (d x N_kv) dS^T (N_kv x R, as stored).
        product(CUBLAS_OP_N, R, n_kv, scale, K_.data(), kv_stride, d, dP_.data(), n_kv, s_stride,
                1, dQ_.data(), q_stride);
        // Line 5: dK^T (d x N_kv) = scale Q^T (d x R) dS (R x N_kv).
        product(CUBLAS_OP_T, n_kv, R, scale, Q_.data(), q_stride, d, dP_.data(), n_kv, s_stride,
                n_kv, dK_.data(), kv_stride);
        synchronize_device();
    }

private:
    CublasHandle cublas_;
    DeviceBuffer<float> P_, dP_, lse_recomputed_;
    bool masked_nonfinite_ = false;
};

}  // namespace

void add_cuda_standard_backward(Backend& b) { add_cuda_backward<PreparedStandardBackward>(b); }

}  // namespace flashattn::cuda
