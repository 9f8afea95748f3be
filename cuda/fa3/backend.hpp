// cuda/fa3/backend.hpp — the `cuda-fa3` backend: FlashAttention-3's ideas on Hopper (the forward:
// cuda/fa3/kernel.cuh; the backward: cuda/fa3/backward_kernel.cuh). Present only in a build with
// sm_90a code, on a GPU of compute capability 9.0.
#pragma once

#include "common/backend.hpp"

namespace flashattn::fa3 {

// Whether this build has cuda-fa3's kernels (CMAKE_CUDA_ARCHITECTURES includes 90a) and the
// current device can run them (compute capability 9.0).
bool fa3_available();

// What every cuda-fa3 kernel needs, forward and backward: a valid problem, f16 or bf16, d = 64, 128
// or 256, inside the tensor-core kernels' grid limits; std::invalid_argument naming the field.
void fa3_check_inputs(const AttentionProblem& p, DType dtype);

// "cuda-fa3": fp16/bf16, d = 64, 128 or 256, forward and backward; host arrays (prepare,
// prepare_backward) or device arrays (run_device, run_backward_device, asynchronous on the
// caller's stream).
Backend fa3_backend();

}  // namespace flashattn::fa3
