// cuda/fa3/backend.hpp — the `cuda-fa3` backend: FlashAttention-3's ideas on Hopper, stage 1 (both
// products on wgmma; cuda/fa3/kernel.cuh). Present only in a build with sm_90a code, on a GPU of
// compute capability 9.0.
#pragma once

#include "common/backend.hpp"

namespace flashattn::fa3 {

// Whether this build has cuda-fa3's kernels (CMAKE_CUDA_ARCHITECTURES includes 90a) and the
// current device can run them (compute capability 9.0).
bool fa3_available();

// "cuda-fa3": fp16/bf16, d = 64 or 128, forward and backward; host arrays (prepare,
// prepare_backward) or device arrays (run_device, run_backward_device, asynchronous on the
// caller's stream).
Backend fa3_backend();

}  // namespace flashattn::fa3
