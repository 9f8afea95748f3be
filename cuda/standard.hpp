// cuda/standard.hpp — cuda-standard, Algorithm 0 with cuBLAS (see standard.cu).
#pragma once

#include "common/backend.hpp"

namespace flashattn::cuda {

Backend cuda_standard_backend();

}  // namespace flashattn::cuda
