// cuda/tc_backend.hpp — the `cuda-tc` backend: FlashAttention-2 on tensor cores (fp16 / bf16).
#pragma once

#include <cstdint>

#include "common/backend.hpp"
#include "cuda/tc_attention.hpp"

namespace flashattn::tc {

// "cuda-tc": the default tile shape for each head dim (the first of tc_tile_shapes).
Backend tc_backend();

// The same kernel with one fixed tile shape, named "cuda-tc[<shape>]" (tests and comparisons).
Backend tc_backend_with_tile(const TcTileShape& tile);

// The 16-bit pattern cuda-tc uploads for x (round to nearest even, as round_to_dtype), and back.
std::uint16_t to_bits(float x, DType dtype);
float from_bits(std::uint16_t bits, DType dtype);

}  // namespace flashattn::tc
