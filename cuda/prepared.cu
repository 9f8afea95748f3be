// cuda/prepared.cu — uploads, poisoned outputs, synchronization and downloads shared by the CUDA
// backends; see prepared.hpp.
#include "cuda/prepared.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/tiling.hpp"
#include "cuda/check.hpp"

namespace flashattn::cuda {

bool inputs_finite(const AttentionProblem& p, const float* Q, const float* K, const float* V) {
    const auto finite = [](const float* x, std::int64_t n) {
        return std::all_of(x, x + n, [](float v) { return std::isfinite(v); });
    };
    return finite(Q, p.q_elements()) && finite(K, p.kv_elements()) && finite(V, p.kv_elements());
}

const DeviceLimits& device_limits() {
    static const DeviceLimits limits = [] {
        DeviceLimits d;
        int device = 0, optin = 0;
        FA_CUDA_CHECK(cudaGetDevice(&device));
        FA_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
        FA_CUDA_CHECK(
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        d.smem_per_block_optin = static_cast<std::size_t>(optin);
        return d;
    }();
    return limits;
}

PreparedCuda::PreparedCuda(const std::string& backend_name, const AttentionProblem& problem,
                           const float* Q, const float* K, const float* V, DType dtype)
    : problem_(problem) {
    validate(problem);
    require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
    if (dtype != DType::f32)
        throw std::invalid_argument("dtype = " + to_string(dtype) + ": " + backend_name +
                                    " computes in float32 only (cuda-tc runs f16/bf16)");
    Q_ = DeviceBuffer<float>(problem.q_elements());
    K_ = DeviceBuffer<float>(problem.kv_elements());
    V_ = DeviceBuffer<float>(problem.kv_elements());
    Q_.upload(Q);
    K_.upload(K);
    V_.upload(V);
    O_ = DeviceBuffer<float>(problem.q_elements());
    lse_ = DeviceBuffer<float>(problem.lse_elements());
    O_.poison();
    lse_.poison();
    if (problem.block_mask.active()) {
        const std::int64_t Tr = tile_count(problem.seq_q, problem.block_mask.block_q);
        const std::int64_t Tc = tile_count(problem.seq_kv, problem.block_mask.block_kv);
        mask_ = DeviceBuffer<std::uint8_t>(static_cast<std::size_t>(Tr * Tc));
        mask_.upload(problem.block_mask.data);
        problem_.block_mask.data = mask_.data();
    }
}

void PreparedCuda::fetch(float* O, float* lse) {
    require_array(O, "O");
    O_.download(O);
    if (lse) lse_.download(lse);
}

void PreparedCuda::synchronize() {
    FA_CUDA_CHECK(cudaGetLastError());
    FA_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace flashattn::cuda
