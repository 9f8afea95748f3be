// cuda/fa2.hpp — cuda-fa2, FlashAttention-2 in float32 with register micro-tiles (see fa2.cu).
#pragma once

#include "cpu/backend.hpp"

namespace flashattn::cuda {

// Supports every head dimension 1..256 (padded to 64, 128 or 256 inside the kernel).
Backend cuda_fa2_backend();

}  // namespace flashattn::cuda
