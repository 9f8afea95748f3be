// cuda/host/tensor_core_eligibility.cu — see cuda/host/tensor_core_eligibility.hpp.
#include "cuda/host/tensor_core_eligibility.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/host/check.hpp"

namespace flashattn::cuda {
namespace {

bool all_finite(const float* x, std::int64_t n) {
    return std::all_of(x, x + n, [](float v) { return std::isfinite(v); });
}

__global__ void find_nonfinite_kernel(const float* __restrict__ x, std::int64_t n, int* found) {
    for (std::int64_t e = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < n;
         e += std::int64_t{gridDim.x} * blockDim.x)
        if (!isfinite(x[e])) *found = 1;  // any thread's write of 1 will do
}

}  // namespace

std::string mma_grid_limits(const AttentionProblem& p) {
    constexpr std::int64_t kMaxGrid = 65535, kMaxSeq = std::int64_t{1} << 30;
    if (p.heads > kMaxGrid || p.batch > kMaxGrid)
        return "heads x batch = " + std::to_string(p.heads) + " x " + std::to_string(p.batch) +
               ": the tensor-core kernels launch one grid row per head and one grid layer per "
               "batch entry, each at most 65535";
    if (p.seq_q > kMaxSeq || p.seq_kv > kMaxSeq)
        return "seq_q/seq_kv = " + std::to_string(p.seq_q) + "/" + std::to_string(p.seq_kv) +
               ": the tensor-core kernels index rows with int, at most 2^30";
    return {};
}

bool tf32_tensor_cores_allowed(const AttentionProblem& p, const float* Q, const float* K,
                               const float* V) {
    return tf32_shape_allowed(p) && all_finite(Q, p.q_elements()) &&
           all_finite(K, p.kv_elements()) && all_finite(V, p.kv_elements());
}

bool tf32_backward_allowed(const AttentionProblem& p, const float* Q, const float* K,
                           const float* V, const float* O, const float* dO) {
    return tf32_tensor_cores_allowed(p, Q, K, V) && all_finite(O, p.q_elements()) &&
           all_finite(dO, p.q_elements());
}

bool tf32_shape_allowed(const AttentionProblem& p) {
    return p.dim >= 16 && mma_grid_limits(p).empty();
}

void queue_nonfinite_test(std::initializer_list<std::pair<const float*, std::int64_t>> arrays,
                          int* flag, void* stream) {
    const auto s = static_cast<cudaStream_t>(stream);
    FA_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), s));
    for (const auto& [x, n] : arrays) {
        find_nonfinite_kernel<<<1024, 256, 0, s>>>(x, n, flag);
        FA_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace flashattn::cuda
