// cuda/backends.hpp — the CUDA backends, as Backend entries for the registry.
#pragma once

#include <string>
#include <vector>

#include "cpu/backend.hpp"

namespace flashattn {

// True when the CUDA runtime finds at least one device.
bool cuda_device_available();

// The name of the current CUDA device ("NVIDIA H100 80GB HBM3"), or "cuda" when it cannot be read.
std::string cuda_device_name();

// The CUDA backends (cuda-standard, cuda-fa1, cuda-fa2, cuda-tc); empty without a device.
std::vector<Backend> cuda_backends();

}  // namespace flashattn
