// cuda/backends.hpp — the CUDA backends, as Backend entries for the registry.
#pragma once

#include <vector>

#include "cpu/backend.hpp"

namespace flashattn {

// True when the CUDA runtime finds at least one device.
bool cuda_device_available();

// The CUDA backends (cuda-standard, cuda-fa1, cuda-fa2, cuda-tc); empty without a device.
std::vector<Backend> cuda_backends();

}  // namespace flashattn
