// cuda/backends.cu — registers the CUDA backends, one file per kernel: cuda/standard/backend.cu,
// cuda/minimal/backend.cu, cuda/fa1/backend.cu, cuda/fa2/backend.cu, cuda/tc/backend.cu,
// cuda/fa3/backend.cu.
#include "cuda/backends.hpp"

#include <cuda_runtime.h>

#include "cuda/fa1/backend.hpp"
#include "cuda/fa2/backend.hpp"
#include "cuda/fa3/backend.hpp"
#include "cuda/host/split_kv.hpp"
#include "cuda/minimal/backend.hpp"
#include "cuda/standard/backend.hpp"
#include "cuda/tc/backend.hpp"

namespace flashattn {

bool cuda_device_available() {
    int count = 0;
    const bool found = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    (void)cudaGetLastError();  // "no device" must not stay behind as a pending error
    return found;
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

void cuda_merge_partials(const float* O_parts, const float* lse_parts, std::int64_t S,
                         std::int64_t rows, std::int64_t d, float* O, float* lse, void* stream) {
    cuda::launch_combine(O_parts, lse_parts, S, rows, d, O, DType::f32, lse, stream);
}

std::vector<Backend> cuda_backends() {
    std::vector<Backend> list;
    if (!cuda_device_available()) return list;
    list.push_back(cuda::cuda_standard_backend());
    list.push_back(cuda::cuda_minimal_backend());  // before cuda-fa1: the learning order
    list.push_back(cuda::cuda_fa1_backend());
    list.push_back(cuda::cuda_fa2_backend());
    list.push_back(tc::tc_backend());
    if (fa3::fa3_available()) list.push_back(fa3::fa3_backend());  // sm_90a builds on Hopper
    return list;
}

}  // namespace flashattn
