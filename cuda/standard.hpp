// cuda/standard.hpp — cuda-standard, Algorithm 0 with cuBLAS (see standard.cu).
#pragma once

#include "common/backend.hpp"

namespace flashattn::cuda {

// Algorithm 0 forward and Algorithm 3 backward (standard_backward.cu).
Backend cuda_standard_backend();
// Gives cuda-standard's Backend entry its backward pass (standard_backward.cu).
void add_cuda_standard_backward(Backend& b);

}  // namespace flashattn::cuda
