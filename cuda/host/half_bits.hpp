// cuda/host/half_bits.hpp — the 16-bit values the tensor-core kernels read (f16 / bf16 bit
// patterns), without the CUDA headers, so host code and tests can name them.
#pragma once

#include <cstdint>

#include "common/dtype.hpp"
#include "common/problem.hpp"

namespace flashattn::cuda {

// The 16-bit pattern of x in f16 / bf16 (round to nearest even, as round_to_dtype), and back.
// Defined in cuda/host/prepared.cu, which uploads them.
std::uint16_t to_bits(float x, DType dtype);
float from_bits(std::uint16_t bits, DType dtype);

// The tensor-core kernels fold a negative scale into Q (negating a 16-bit value is exact), so
// that their row maxima are maxima of |scale| s: Q is uploaded times this sign.
inline float q_sign(const AttentionProblem& p) { return p.softmax_scale() < 0 ? -1.0f : 1.0f; }

}  // namespace flashattn::cuda
