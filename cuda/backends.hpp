// cuda/backends.hpp — the CUDA backends, as Backend entries for the registry, and whether this
// machine has a CUDA device.
#pragma once

#include <string>
#include <vector>

#include "common/registry.hpp"

namespace flashattn {

// True when the CUDA runtime finds at least one device.
bool cuda_device_available();

// cuda_backends() and cuda_device_name() are declared with the registry (common/registry.hpp).

}  // namespace flashattn
