// cuda/backends.cu — registers the CUDA backends (the kernels land in later files).
#include "cuda/backends.hpp"

#include <cuda_runtime.h>

namespace flashattn {

bool cuda_device_available() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string cuda_device_name() {
    int device = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();  // leave no pending error behind
        return "cuda";
    }
    return prop.name;
}

std::vector<Backend> cuda_backends() {
    std::vector<Backend> list;
    if (!cuda_device_available()) return list;
    return list;
}

}  // namespace flashattn
