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

// The hardware behind a Backend::device ("cpu" or "cuda"), for reports: the CPU's model name
// ("model name" in /proc/cpuinfo) or the CUDA device's name; `device` itself when unknown.
std::string device_name(const std::string& device);

}  // namespace flashattn
