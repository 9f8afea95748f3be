// cuda/standard/backend.cu — cuda-standard: the paper's Algorithm 0 (standard attention) on the
// GPU, the baseline FlashAttention is measured against.
//
//   line 1: S = Q K^T            cuBLAS SGEMM (strided-batched), written to HBM   (N_q x N_kv)
//   line 2: P = softmax(S)       one warp per row, read S from HBM, write P over it
//   line 3: O = P V              cuBLAS SGEMM, reading P from HBM
//
// S and P are materialized in global memory: B*H*N_q*N_kv floats (P overwrites S in place, so
// the N^2 buffer is allocated once; it is still written, read, written and read again, which is
// the HBM traffic of Algorithm 0). extra_bytes() reports that buffer.
//
// Float32 baseline: cuBLAS runs with CUBLAS_DEFAULT_MATH, which never uses TF32 tensor cores, so
// these are real FP32 FMAs like the flash kernels (PyTorch's MATH backend in fp32 with
// allow_tf32 = False is the same computation).
//
// GQA/MQA: the g = H / H_kv query heads that share one K/V head are adjacent in Q's (B, H, N_q, d)
// layout, so they form one (g*N_q) x d matrix; S and O are laid out the same way. One GEMM per
// K/V head then serves the whole group, and a strided batch runs over the B*H_kv K/V heads.
//
// Row-major vs cuBLAS's column-major: a row-major (r x c) matrix is a column-major (c x r) one,
// so S = Q K^T (row-major) is computed as S^T = K Q^T (column-major), and O = P V as O^T = V^T P^T.
//
// The softmax (line 2) uses the common online-softmax rule: each lane folds its keys into a
// running (m, l) with merge_softmax, the lanes' states are merged the same way, then
// P = exp(S - m) / l. Masks are applied while reading S (bottom-right causal, block mask).
// A fully masked row gives P = 0 (so O = 0) and LSE = -inf; a NaN score makes the row NaN.
//
// Masked keys and non-finite V: the P V GEMM multiplies a masked key by P = 0, and 0 * NaN (or
// 0 * inf) is NaN, so a NaN in a V row would leak into query rows that mask that key (PyTorch's
// MATH backend does this). docs/design.md's NaN rule (Numerics) is that only rows that attend key j
// see V_j, so when a mask is active and V holds a non-finite value (checked once in prepare()),
// line 3 runs masked_pv_kernel instead, which leaves masked keys out of the sum as the flash
// kernels do. The GEMM stays the path for every finite input.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>

#include "common/memory.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/standard/backend.hpp"
#include "cuda/standard/stages.cuh"

namespace flashattn::cuda {
namespace {

using standard::checked_int;
using standard::CublasHandle;
using standard::launch_softmax_rows;

// Algorithm 0 line 3 without the GEMM, for the rare case above: O_i = sum over the keys j that
// row i attends of P_ij V_j. One block per query row, threads over the d columns.
__global__ void masked_pv_kernel(const AttentionProblem p, const float* __restrict__ P,
                                 const float* __restrict__ V, float* __restrict__ O) {
    const std::int64_t row = blockIdx.x;  // (b, h, i) flattened, as in S and O
    const std::int64_t i = row % p.seq_q, bh = row / p.seq_q;
    const float* V_h = V + p.kv_offset(bh / p.heads, bh % p.heads);
    const float* P_row = P + row * p.seq_kv;
    for (std::int64_t c = threadIdx.x; c < p.dim; c += blockDim.x) {
        float o = 0.0f;
        for (std::int64_t j = 0; j < p.seq_kv; ++j)
            if (p.key_visible(i, j)) o += P_row[j] * V_h[j * p.dim + c];
        O[row * p.dim + c] = o;
    }
}

constexpr int kKeyChunk = 256;  // keys per P V GEMM (see execute)

class PreparedStandard final : public PreparedCuda {
public:
    PreparedStandard(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                     DType dtype)
        : PreparedCuda("cuda-standard", p, Q, K, V, dtype) {
        // B*H*N_q*N_kv can overflow int64 for sizes validate() accepts: work_elements checks.
        S_ = workspace<float>(
            static_cast<std::size_t>(work_elements(p.batch * p.heads * p.seq_q, p.seq_kv)));
        masked_nonfinite_v_ = (p.causal || p.block_mask.active()) &&
                              std::any_of(V, V + p.kv_elements(),
                                          [](float x) { return !std::isfinite(x); });
    }

    void execute() override {
        const AttentionProblem& p = problem_;
        const int d = checked_int(p.dim, "dim");
        const int n_kv = checked_int(p.seq_kv, "seq_kv");
        const int group_rows = checked_int(p.group_size() * p.seq_q, "(heads/heads_kv)*seq_q");
        const int kv_heads = checked_int(p.batch * p.heads_kv, "batch*heads_kv");
        const long long q_stride = static_cast<long long>(group_rows) * d;   // one group of Q or O
        const long long kv_stride = static_cast<long long>(n_kv) * d;        // one K/V head
        const long long s_stride = static_cast<long long>(group_rows) * n_kv;  // one group of S
        const float scale = p.softmax_scale(), one = 1.0f, zero = 0.0f;

        // Line 1: S^T (N_kv x g*N_q, column-major) = K (as d x N_kv, transposed) * Q^T (d x g*N_q).
        FA_CUBLAS_CHECK(cublasSgemmStridedBatched(
            cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, n_kv, group_rows, d, &scale, K_.data(), d,
            kv_stride, Q_.data(), d, q_stride, &zero, S_.data(), n_kv, s_stride, kv_heads));

        // Line 2: P = softmax(S), in place, and LSE.
        launch_softmax_rows(p, S_.data(), lse_.data());
        const std::int64_t rows = p.batch * p.heads * p.seq_q;

        // Line 3: O^T (d x g*N_q) = V^T (d x N_kv) * P^T (N_kv x g*N_q).
        if (masked_nonfinite_v_) {  // see the header: masked keys must stay out of the sum
            if (rows > std::numeric_limits<int>::max())
                throw std::invalid_argument("batch*heads*seq_q = " + std::to_string(rows) +
                                            ": too many rows for one masked P V launch");
            masked_pv_kernel<<<static_cast<unsigned>(rows), 128>>>(p, S_.data(), V_.data(),
                                                                    O_.data());
            FA_CUDA_CHECK_LAUNCH();
            synchronize();
            return;
        }
        // For d < 16, in chunks of kKeyChunk keys, each added to O (beta = 1 after the first):
        // there cuBLAS may sum all N_kv products of an output in one float chain, which drifts by
        // ~sqrt(N_kv) ulps, more than the 2x rule allows against a blocked CPU GEMM when O is a
        // mean of ~1000 tiny values (test_variants, "long sums over keys": 1.23x at d = 3,
        // N_kv = 1023 in one run). Each chunk re-reads and re-writes O, which costs nothing at
        // such d; at larger d the bound is not near its eps and one GEMM keeps the baseline's
        // speed.
        const int chunk = d < 16 ? kKeyChunk : n_kv;
        for (int c0 = 0; c0 < n_kv; c0 += chunk) {
            const int keys = std::min(chunk, n_kv - c0);
            FA_CUBLAS_CHECK(cublasSgemmStridedBatched(
                cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, d, group_rows, keys, &one,
                V_.data() + static_cast<long long>(c0) * d, d, kv_stride, S_.data() + c0, n_kv,
                s_stride, c0 == 0 ? &zero : &one, O_.data(), d, q_stride, kv_heads));
        }
        synchronize();
    }

private:
    CublasHandle cublas_;
    DeviceBuffer<float> S_;  // S, then P in place: the N_q x N_kv matrices of Algorithm 0
    bool masked_nonfinite_v_ = false;  // a mask is active and V has a NaN or inf: no PV GEMM
};

}  // namespace

Backend cuda_standard_backend() {
    Backend b = make_cuda_backend<PreparedStandard>(
        "cuda-standard",
        "Algorithm 0 on the GPU: cuBLAS SGEMMs (no TF32) + softmax kernel, "
        "S/P in HBM",
        TileSizes::none);
    add_cuda_standard_backward(b);
    return b;
}

}  // namespace flashattn::cuda
