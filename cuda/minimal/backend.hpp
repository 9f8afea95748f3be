// cuda/minimal/backend.hpp — cuda-minimal, the first GPU step: Algorithm 1's arithmetic with one
// thread per query row, short enough to read in one sitting (see cuda/minimal/backend.cu and
// docs/cuda_minimal.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/backend.hpp"

namespace flashattn::cuda {

// Shared memory one thread block of cuda-minimal uses at head dimension d, in bytes:
//   (2 Br (d|1) + 2 Bc d + Br (Bc + 1)) * 4   with Br = Bc = 32
// (Q_i and O_i, K_j and V_j, S_ij; rows owned by one thread padded to an odd length, see
// cuda/minimal/backend.cu). prepare() throws std::invalid_argument when it exceeds the device's
// limit.
std::size_t cuda_minimal_smem_bytes(std::int64_t d);

Backend cuda_minimal_backend();

}  // namespace flashattn::cuda
