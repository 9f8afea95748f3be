// cuda/backends.cu — registers the CUDA backends (the kernels land in later files).
#include "cuda/backends.hpp"

#include <cuda_runtime.h>

#include "cuda/tc_backend.hpp"

namespace flashattn {

bool cuda_device_available() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::vector<Backend> cuda_backends() {
    std::vector<Backend> list;
    if (!cuda_device_available()) return list;
    list.push_back(tc::tc_backend());
    return list;
}

}  // namespace flashattn
