// cuda/host/prepared_backward.hpp — what every CUDA backward does around its kernels (the
// backward's counterpart of cuda/host/prepared.hpp): upload Q, K, V, O, LSE and dO, hold dQ, dK, dV
// *poisoned* (NaN) on the device, synchronize, download. The inputs arrive as float32 arrays; Q, K,
// V and dO are kept as float32 (InputForm::f32) or rounded to the 16 bits of the dtype
// (InputForm::bits16, cuda-tc; Q times q_sign, as the forward's), O and LSE always as float32.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "common/backend.hpp"
#include "cuda/host/device_buffer.hpp"
#include "cuda/host/prepared.hpp"

namespace flashattn::cuda {

class PreparedCudaBackward : public PreparedBackward {
public:
    // Validates the problem, the inputs and the dtype (f32, or f16/bf16 for bits16), then
    // uploads everything.
    PreparedCudaBackward(const std::string& backend_name, const AttentionProblem& problem,
                         const BackwardInputs& in, DType dtype, InputForm form = InputForm::f32);

    void fetch(float* dQ, float* dK, float* dV) override;
    std::size_t extra_bytes() const override { return workspace_.bytes(); }

protected:
    template <class T>
    DeviceBuffer<T> workspace(std::size_t count) {
        return workspace_.allocate<T>(count);
    }

    AttentionProblem problem_;  // block_mask.data points to the device copy
    DType dtype_;
    DeviceBuffer<float> Q_, K_, V_, O_, lse_, dO_, dQ_, dK_, dV_;
    DeviceBuffer<std::uint16_t> Q16_, K16_, V16_, dO16_;  // InputForm::bits16
    DeviceBuffer<std::uint8_t> mask_;

private:
    DeviceWorkspace workspace_;
};

// Gives a CUDA Backend a backward whose prepare constructs a `Prepared` (a PreparedCudaBackward
// subclass taking (problem, inputs, dtype)).
template <class Prepared>
void add_cuda_backward(Backend& b) {
    b.prepare_backward = [](const AttentionProblem& p, const BackwardInputs& in,
                            DType dtype) -> std::unique_ptr<PreparedBackward> {
        return std::make_unique<Prepared>(p, in, dtype);
    };
}

}  // namespace flashattn::cuda
