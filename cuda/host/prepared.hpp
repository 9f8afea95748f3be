// cuda/host/prepared.hpp — what every CUDA backend does around its kernels: upload the inputs, hold
// the outputs and working memory on the device, synchronize, download.
//
// prepare() (the constructor) copies Q, K, V and the block mask to the device and allocates O and
// LSE *poisoned* (every byte 0xFF, a NaN), so an element a kernel forgets to write is seen by the
// tests. execute() is each backend's own (launch, then synchronize()). fetch() copies O and LSE
// back. Working memory beyond inputs and outputs (S and P of cuda-standard, l and m of cuda-fa1)
// is allocated through workspace(), which counts its bytes for extra_bytes().
//
// Inputs are kept in one of two forms (InputForm): float32 for the fp32 backends, which refuse a
// request for f16/bf16 with std::invalid_argument, or 16-bit values of the requested f16/bf16
// (cuda-tc), which refuses f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/backend.hpp"
#include "cuda/host/device_buffer.hpp"
#include "cuda/host/half_bits.hpp"

namespace flashattn::cuda {

// What the kernels need to know about the current device (queried once per device: a process may
// drive GPUs of different kinds).
struct DeviceLimits {
    int sm_count = 0;
    int compute_major = 0;                 // 9 on Hopper
    std::size_t smem_per_block_optin = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
};
const DeviceLimits& device_limits();
// Lets `kernel` take `bytes` of dynamic shared memory on the current device
// (cudaFuncSetAttribute, MaxDynamicSharedMemorySize), asked of the driver once per kernel and
// device: the device entries launch on every call of a model, and the setting stays.
void allow_dynamic_shared_memory(const void* kernel, int bytes);
template <class Kernel>
void allow_dynamic_shared_memory(Kernel* kernel, int bytes) {
    allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), bytes);
}
// Whether `kernel`, as it runs on the current device, was compiled from PTX for sm_90 or later,
// where griddepcontrol exists (cuda/ptx/dependent_launch.cuh): a build for older GPUs alone, run
// on Hopper, compiles the wait to nothing, and its kernels must be launched in the ordinary way.
// Asked of the driver once per kernel and device.
bool has_grid_dependency_control(const void* kernel);
// Throws std::runtime_error when a kernel's `bytes` of shared memory per block exceed what this
// device allows, naming the kernel (`what`: "cuda-tc: tile Br64-Bc64 at d = 128").
void require_shared_memory(std::size_t bytes, const std::string& what);

// How the kernels read Q, K and V: float32 (Q_, K_, V_) or 16-bit values of the dtype (Q16_, K16_,
// V16_; Q16_ holds q_sign * Q, since the tensor-core kernel folds a negative scale into Q, which
// negating a 16-bit value does exactly).
enum class InputForm { f32, bits16 };

// n floats in a new device array.
DeviceBuffer<float> upload_floats(const float* x, std::int64_t n);
// n floats times `sign` (exact), rounded to 16 bits of `dtype` (f16 or bf16), in a new device
// array.
DeviceBuffer<std::uint16_t> upload_bits(const float* x, std::int64_t n, DType dtype, float sign);
// The problem's block mask (if any) in a new device array; problem.block_mask.data then points to
// it, so host code must not read through it.
DeviceBuffer<std::uint8_t> upload_block_mask(AttentionProblem& problem);
// The problem as a device entry's kernels see it (common/backend.hpp): block_mask.data replaced by
// the caller's device copy. Throws std::invalid_argument when the problem has a block mask and no
// device copy was given, or the other way round.
AttentionProblem with_device_mask(const AttentionProblem& problem, const std::uint8_t* device_mask);
// Waits for the device and turns any asynchronous error into an exception. The prepared (host
// array) paths only: the device entries never wait.
void synchronize_device();

class PreparedCuda : public PreparedAttention {
public:
    // Validates the problem (std::invalid_argument) and the dtype, then uploads everything.
    PreparedCuda(const std::string& backend_name, const AttentionProblem& problem, const float* Q,
                 const float* K, const float* V, DType dtype, InputForm form = InputForm::f32);

    void fetch(float* O, float* lse) override;
    std::size_t extra_bytes() const override { return workspace_.bytes(); }

protected:
    // Device working memory, counted for extra_bytes().
    template <class T>
    DeviceBuffer<T> workspace(std::size_t count) {
        return workspace_.allocate<T>(count);
    }
    // Waits for the device and turns any asynchronous error (a fault inside a kernel) into an
    // exception. Every execute() ends with it: execute() blocks until the result is complete.
    static void synchronize();

    // The problem as the kernels see it: block_mask.data points to the device copy of the mask,
    // so host code must not read through it.
    AttentionProblem problem_;
    DType dtype_;
    DeviceBuffer<float> Q_, K_, V_, O_, lse_;
    DeviceBuffer<std::uint16_t> Q16_, K16_, V16_;
    DeviceBuffer<std::uint8_t> mask_;

private:
    DeviceWorkspace workspace_;
};

// A Backend entry whose prepare() constructs a `Prepared` (a PreparedCuda subclass taking
// (problem, Q, K, V, dtype)); the CUDA counterpart of cpu_backend(). tile_sizes says whether
// explicit tile sizes are honored (common/backend.hpp).
template <class Prepared>
Backend make_cuda_backend(std::string name, std::string summary, TileSizes tile_sizes) {
    Backend b;
    b.name = std::move(name);
    b.device = "cuda";
    b.summary = std::move(summary);
    b.dtypes = {DType::f32};
    b.tile_sizes = tile_sizes;
    b.prepare = [](const AttentionProblem& p, const float* Q, const float* K, const float* V,
                   DType dtype) -> std::unique_ptr<PreparedAttention> {
        return std::make_unique<Prepared>(p, Q, K, V, dtype);
    };
    return b;
}

}  // namespace flashattn::cuda
