// cuda/fa2/backend.hpp — cuda-fa2, FlashAttention-2 in float32 with register micro-tiles (see
// cuda/fa2/backend.cu).
#pragma once

#include <string>
#include <vector>

#include "common/backend.hpp"

namespace flashattn::cuda {

// The compiled kernel configurations ("d64_128x32_2b": D = 64, Br x Bc = 128 x 32, 2 blocks per
// SM, ...; "d128_tf32_128x64": the 3xTF32 tensor-core kernel). The default is the first
// tensor-core one whose max_dim covers d (for 16 <= d <= 128 and finite inputs), else the first
// FFMA one; FLASHATTN_VARIANT=cuda-fa2=<name> selects another one that covers d, "ffma" or "tf32"
// the default of that kernel (for tuning and its tests).
struct Fa2VariantInfo {
    std::string name;
    int max_dim;
};
std::vector<Fa2VariantInfo> fa2_variants();

// Supports every head dimension 1..256 (padded to 64, 128 or 256 inside the kernel). Its backward
// (cuda/fa2/backward.cu) too, in float32.
Backend cuda_fa2_backend();
// Gives cuda-fa2's Backend entry its backward pass (cuda/fa2/backward.cu).
void add_cuda_fa2_backward(Backend& b);

}  // namespace flashattn::cuda
