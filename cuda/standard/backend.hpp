// cuda/standard/backend.hpp — cuda-standard, Algorithm 0 with cuBLAS (see
// cuda/standard/backend.cu).
#pragma once

#include "common/backend.hpp"

namespace flashattn::cuda {

// Algorithm 0 forward and Algorithm 3 backward (cuda/standard/backward.cu).
Backend cuda_standard_backend();
// Gives cuda-standard's Backend entry its backward pass (cuda/standard/backward.cu).
void add_cuda_standard_backward(Backend& b);

}  // namespace flashattn::cuda
