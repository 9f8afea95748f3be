// cuda/host/prepared.cu — uploads, poisoned outputs, synchronization and downloads shared by the
// CUDA backends; see cuda/host/prepared.hpp.
#include "cuda/host/prepared.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/tiling.hpp"
#include "cuda/host/check.hpp"

namespace flashattn::cuda {

namespace {

int current_device() {
    int device = 0;
    FA_CUDA_CHECK(cudaGetDevice(&device));
    return device;
}

}  // namespace

const DeviceLimits& device_limits() {
    static std::mutex mutex;
    static std::map<int, DeviceLimits> known;  // a map's entries stay where they are
    const int device = current_device();
    const std::lock_guard<std::mutex> lock(mutex);
    auto found = known.find(device);
    if (found != known.end()) return found->second;
    const DeviceLimits limits = [device] {
        DeviceLimits d;
        int optin = 0;
        FA_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
        FA_CUDA_CHECK(
            cudaDeviceGetAttribute(&d.compute_major, cudaDevAttrComputeCapabilityMajor, device));
        FA_CUDA_CHECK(
            cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        d.smem_per_block_optin = static_cast<std::size_t>(optin);
        return d;
    }();
    return known.emplace(device, limits).first->second;
}

void allow_dynamic_shared_memory(const void* kernel, int bytes) {
    static std::mutex mutex;
    static std::map<std::pair<const void*, int>, int> allowed;  // (kernel, device) -> bytes
    const int device = current_device();
    const std::lock_guard<std::mutex> lock(mutex);
    int& have = allowed[{kernel, device}];
    if (have >= bytes) return;
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    have = bytes;
}

bool has_grid_dependency_control(const void* kernel) {
    static std::mutex mutex;
    static std::map<std::pair<const void*, int>, bool> known;  // (kernel, device) -> answer
    const int device = current_device();
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = known.find({kernel, device});
    if (found != known.end()) return found->second;
    cudaFuncAttributes attributes = {};
    FA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    return known[{kernel, device}] = attributes.ptxVersion >= 90;
}

void require_shared_memory(std::size_t bytes, const std::string& what) {
    const std::size_t limit = device_limits().smem_per_block_optin;
    if (bytes > limit)
        throw std::runtime_error(what + " needs " + std::to_string(bytes) +
                                 " bytes of shared memory per block; this device allows " +
                                 std::to_string(limit));
}

std::uint16_t to_bits(float x, DType dtype) {
    if (dtype == DType::bf16) {
        const __nv_bfloat16_raw r = __float2bfloat16_rn(x);
        return r.x;
    }
    const __half_raw r = __float2half_rn(x);
    return r.x;
}

float from_bits(std::uint16_t bits, DType dtype) {
    if (dtype == DType::bf16) {
        __nv_bfloat16_raw r;
        r.x = bits;
        return __bfloat162float(__nv_bfloat16(r));
    }
    __half_raw r;
    r.x = bits;
    return __half2float(__half(r));
}

DeviceBuffer<std::uint16_t> upload_bits(const float* x, std::int64_t n, DType dtype, float sign) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k) bits[k] = to_bits(sign * x[k], dtype);
    DeviceBuffer<std::uint16_t> device(bits.size());
    device.upload(bits.data());
    return device;
}

PreparedCuda::PreparedCuda(const std::string& backend_name, const AttentionProblem& problem,
                           const float* Q, const float* K, const float* V, DType dtype,
                           InputForm form)
    : problem_(problem), dtype_(dtype) {
    validate(problem);
    require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
    if (form == InputForm::f32) {
        if (dtype != DType::f32)
            throw std::invalid_argument("dtype = " + to_string(dtype) + ": " + backend_name +
                                        " computes in float32 only (cuda-tc runs f16/bf16)");
        Q_ = upload_floats(Q, problem.q_elements());
        K_ = upload_floats(K, problem.kv_elements());
        V_ = upload_floats(V, problem.kv_elements());
    } else {
        if (dtype != DType::f16 && dtype != DType::bf16)
            throw std::invalid_argument("dtype = " + to_string(dtype) + ": " + backend_name +
                                        " computes in f16 or bf16 (tensor cores)");
        Q16_ = upload_bits(Q, problem.q_elements(), dtype, q_sign(problem));
        K16_ = upload_bits(K, problem.kv_elements(), dtype, 1.0f);
        V16_ = upload_bits(V, problem.kv_elements(), dtype, 1.0f);
    }
    O_ = DeviceBuffer<float>(problem.q_elements());
    lse_ = DeviceBuffer<float>(problem.lse_elements());
    O_.poison();
    lse_.poison();
    mask_ = upload_block_mask(problem_);
}

DeviceBuffer<float> upload_floats(const float* x, std::int64_t n) {
    DeviceBuffer<float> device(static_cast<std::size_t>(n));
    device.upload(x);
    return device;
}

DeviceBuffer<std::uint8_t> upload_block_mask(AttentionProblem& problem) {
    if (!problem.block_mask.active()) return {};
    const std::int64_t Tr = tile_count(problem.seq_q, problem.block_mask.block_q);
    const std::int64_t Tc = tile_count(problem.seq_kv, problem.block_mask.block_kv);
    DeviceBuffer<std::uint8_t> mask(static_cast<std::size_t>(Tr * Tc));
    mask.upload(problem.block_mask.data);
    problem.block_mask.data = mask.data();
    return mask;
}

AttentionProblem with_device_mask(const AttentionProblem& problem, const std::uint8_t* device_mask) {
    if (problem.block_mask.active() != (device_mask != nullptr))
        throw std::invalid_argument(
            problem.block_mask.active()
                ? "block_mask = null: the problem has a block mask, so its device copy is required"
                : "block_mask: a device copy was given for a problem without a block mask");
    AttentionProblem p = problem;
    p.block_mask.data = device_mask;
    return p;
}

void synchronize_device() {
    FA_CUDA_CHECK(cudaGetLastError());
    FA_CUDA_CHECK(cudaDeviceSynchronize());
}

void PreparedCuda::fetch(float* O, float* lse) {
    require_array(O, "O");
    O_.download(O);
    if (lse) lse_.download(lse);
}

void PreparedCuda::synchronize() { synchronize_device(); }

}  // namespace flashattn::cuda
