// cuda/tensor_cores.cu — see tensor_cores.hpp.
#include "cuda/tensor_cores.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flashattn::cuda {
namespace {

bool all_finite(const float* x, std::int64_t n) {
    return std::all_of(x, x + n, [](float v) { return std::isfinite(v); });
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
    return p.dim >= 16 && mma_grid_limits(p).empty() && all_finite(Q, p.q_elements()) &&
           all_finite(K, p.kv_elements()) && all_finite(V, p.kv_elements());
}

}  // namespace flashattn::cuda
