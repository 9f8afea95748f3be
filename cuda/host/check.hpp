// cuda/host/check.hpp — CUDA and cuBLAS failures become C++ exceptions.
//
// docs/design.md, Shapes and errors: nothing aborts. A failed CUDA call (out of memory, a bad
// launch, an illegal address) throws std::runtime_error carrying the call, the file:line and the
// library's own error string, so the CLI prints "error: ..." and exits 2 and a test reports which
// call failed.
//
//   FA_CUDA_CHECK(cudaMalloc(&p, bytes));
//   my_kernel<<<grid, block>>>(...);
//   FA_CUDA_CHECK_LAUNCH();                    // the launch itself (bad configuration, ...)
//   FA_CUBLAS_CHECK(cublasSgemm(...));
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace flashattn::cuda {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
    if (status == cudaSuccess) return;
    (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(status) + " (" +
                             cudaGetErrorName(status) + ") in " + call + " at " + file + ":" +
                             std::to_string(line));
}

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    throw std::runtime_error(std::string("cuBLAS error: ") + cublasGetStatusString(status) +
                             " in " + call + " at " + file + ":" + std::to_string(line));
}

}  // namespace flashattn::cuda

#define FA_CUDA_CHECK(call) ::flashattn::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define FA_CUDA_CHECK_LAUNCH() \
    ::flashattn::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
#define FA_CUBLAS_CHECK(call) ::flashattn::cuda::check_cublas((call), #call, __FILE__, __LINE__)
