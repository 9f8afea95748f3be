// common/registry.hpp — the list of backends this build offers (CPU always, CUDA when built with
// it), and the one way to find one by name.
//
// The registry sits above the forms: cpu/ and cuda/ each provide their list (declared below,
// defined in cpu/backends.cpp and cuda/backends.cu) and common/registry.cpp joins them, so neither
// form's library includes the other's headers.
#pragma once

#include <string>
#include <vector>

#include "common/backend.hpp"

namespace flashattn {

// Every backend compiled into this build, CPU first. CUDA backends appear only when the build
// has CUDA and a device is present.
const std::vector<Backend>& available_backends();

// The backend of that name; throws std::invalid_argument listing the available names.
const Backend& find_backend(const std::string& name);

// The hardware behind a Backend::device ("cpu" or "cuda"), for reports: the CPU's model name
// ("model name" in /proc/cpuinfo) or the CUDA device's name; `device` itself when unknown.
std::string device_name(const std::string& device);

// The merge of S partial results per row (flashattn.merge_partials on CUDA tensors): O_parts
// (S, rows, d) and lse_parts (S, rows) already on the GPU, merged into O (rows, d) and lse (rows)
// with common/online_softmax.hpp's rule, queued on `stream` (a cudaStream_t). Throws
// std::invalid_argument for d outside [1, 256] or S < 1, std::runtime_error in a build without
// CUDA.
void merge_partials_device(const float* O_parts, const float* lse_parts, std::int64_t S,
                           std::int64_t rows, std::int64_t d, float* O, float* lse, void* stream);

// --- provided by the forms' libraries ------------------------------------------------------------
std::vector<Backend> cpu_backends();  // cpu/backends.cpp
// cuda/backends.cu, in builds with CUDA: the CUDA backends (empty without a device), and the
// current device's name ("NVIDIA H100 80GB HBM3"; "cuda" when it cannot be read).
std::vector<Backend> cuda_backends();
std::string cuda_device_name();
void cuda_merge_partials(const float* O_parts, const float* lse_parts, std::int64_t S,
                         std::int64_t rows, std::int64_t d, float* O, float* lse, void* stream);

}  // namespace flashattn
