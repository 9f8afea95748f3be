// cuda/prepared_backward.hpp — what every CUDA backward does around its kernels (the backward's
// counterpart of prepared.hpp): upload Q, K, V, O, LSE and dO, hold dQ, dK, dV *poisoned* (NaN) on
// the device, synchronize, download. fp32 only: the backward's inputs are float32 arrays.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "common/backend.hpp"
#include "cuda/device_buffer.hpp"
#include "cuda/prepared.hpp"

namespace flashattn::cuda {

class PreparedCudaBackward : public PreparedBackward {
public:
    // Validates the problem, the inputs and the dtype (f32), then uploads everything.
    PreparedCudaBackward(const std::string& backend_name, const AttentionProblem& problem,
                         const BackwardInputs& in, DType dtype);

    void fetch(float* dQ, float* dK, float* dV) override;
    std::size_t extra_bytes() const override { return workspace_.bytes(); }

protected:
    template <class T>
    DeviceBuffer<T> workspace(std::size_t count) {
        return workspace_.allocate<T>(count);
    }

    AttentionProblem problem_;  // block_mask.data points to the device copy
    DeviceBuffer<float> Q_, K_, V_, O_, lse_, dO_, dQ_, dK_, dV_;
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
