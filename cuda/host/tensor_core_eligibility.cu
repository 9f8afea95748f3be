// cuda/host/tensor_core_eligibility.cu — see cuda/host/tensor_core_eligibility.hpp.
#include "cuda/host/tensor_core_eligibility.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "cuda/host/check.hpp"

namespace flashattn::cuda {
namespace {

bool all_finite(const float* x, std::int64_t n) {
    return std::all_of(x, x + n, [](float v) { return std::isfinite(v); });
}

// At most five arrays (the backward's Q, K, V, O and dO), passed by value to one launch.
constexpr int kMaxTestedArrays = 5;
struct TestedArrays {
    const float* x[kMaxTestedArrays];
    std::int64_t n[kMaxTestedArrays];
    int count;
};

// kNonfiniteSlots CTAs stride over every array; CTA b writes flags[b] whatever it found.
constexpr int kScanThreads = 1024;
__global__ void __launch_bounds__(kScanThreads)
    find_nonfinite_kernel(const TestedArrays a, int* __restrict__ flags) {
    const std::int64_t first = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    bool found = false;
#pragma unroll  // constant indices: the arrays stay in the parameter space, not on a stack
    for (int k = 0; k < kMaxTestedArrays; ++k) {
        if (k >= a.count) break;
        const float* __restrict__ x = a.x[k];
        // 16-byte loads where the array starts on 16 bytes (PyTorch's allocations do): a thread
        // then has four times the bytes in flight per load, which a scan of HBM needs to run at
        // its bandwidth; the last n % 4 values (and a misaligned array) one at a time.
        std::int64_t scalar_from = 0;
        if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
            const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
            const std::int64_t n4 = a.n[k] / 4;
#pragma unroll 4
            for (std::int64_t e = first; e < n4; e += stride) {
                const float4 v = x4[e];
                found |= !isfinite(v.x) | !isfinite(v.y) | !isfinite(v.z) | !isfinite(v.w);
            }
            scalar_from = 4 * n4;
        }
        for (std::int64_t e = scalar_from + first; e < a.n[k]; e += stride) found |= !isfinite(x[e]);
    }
    const bool any = __syncthreads_or(found);
    if (threadIdx.x == 0) flags[blockIdx.x] = any ? 1 : 0;
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

void queue_nonfinite_test(const std::vector<FloatSpan>& arrays, int* flags, void* stream) {
    if (arrays.size() > kMaxTestedArrays)
        throw std::logic_error("queue_nonfinite_test: at most 5 arrays in one launch");
    std::vector<MemoryRange> ranges;
    for (const FloatSpan& s : arrays) {
        const auto begin = reinterpret_cast<std::uintptr_t>(s.x);
        ranges.push_back({begin, begin + std::uintptr_t(s.n) * sizeof(float)});
    }
    TestedArrays a{};
    for (const MemoryRange& r : merged_ranges(ranges)) {
        a.x[a.count] = reinterpret_cast<const float*>(r.begin);
        a.n[a.count++] = std::int64_t((r.end - r.begin) / sizeof(float));
    }
    find_nonfinite_kernel<<<kNonfiniteSlots, kScanThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        a, flags);
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda
