// cuda/tc/backend.hpp — the `cuda-tc` backend: FlashAttention-2 on tensor cores (fp16 / bf16).
#pragma once

#include <cstdint>

#include "common/backend.hpp"
#include "cuda/tc/forward.hpp"

namespace flashattn::tc {

// "cuda-tc": the default tile shape for each problem (tc_default_tile: the decoding shape at
// decoding shapes, else the first of tc_tile_shapes), or the one FLASHATTN_VARIANT=cuda-tc=<shape
// name> asks for (cuda/host/variants.hpp).
Backend tc_backend();

// The 16-bit values cuda-tc computes with (cuda/host/half_bits.hpp).
using cuda::from_bits;
using cuda::to_bits;

}  // namespace flashattn::tc
