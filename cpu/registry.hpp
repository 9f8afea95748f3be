// cpu/registry.hpp — the list of backends this build offers (CPU always, CUDA when built with it).
#pragma once

#include <string>
#include <vector>

#include "cpu/backend.hpp"

namespace flashattn {

// Every backend compiled into this build, CPU first. CUDA backends appear only when the build
// has CUDA and a device is present (`cuda_device_available()`).
const std::vector<Backend>& available_backends();

// The backend of that name; throws std::invalid_argument listing the available names.
const Backend& find_backend(const std::string& name);

}  // namespace flashattn
