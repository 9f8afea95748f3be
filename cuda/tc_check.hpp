// cuda/tc_check.hpp — CUDA error checking and device buffers for the cuda-tc backend.
//
// Every CUDA call of cuda-tc goes through TC_CHECK, which turns a failure into std::runtime_error
// naming the call, the file:line and CUDA's message (nothing aborts). TcDeviceArray<T> owns a
// cudaMalloc'ed array and frees it when it goes out of scope, so an exception in prepare() leaks
// nothing. (The fp32 CUDA backends carry an equivalent pair; the two can merge.)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace flashattn::tc {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess)
        throw std::runtime_error(std::string("CUDA error in ") + call + " (" + file + ":" +
                                 std::to_string(line) + "): " + cudaGetErrorName(status) + ": " +
                                 cudaGetErrorString(status));
}

#define TC_CHECK(call) ::flashattn::tc::check_cuda((call), #call, __FILE__, __LINE__)

template <class T>
class TcDeviceArray {
public:
    TcDeviceArray() = default;
    explicit TcDeviceArray(std::size_t count) : count_(count) {
        if (count == 0) return;
        const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T));
        if (status != cudaSuccess) {
            (void)cudaGetLastError();  // not sticky: clear it so later checks do not see it
            throw std::runtime_error("CUDA out of memory allocating " +
                                     std::to_string(count * sizeof(T)) + " bytes: " +
                                     cudaGetErrorString(status));
        }
    }
    TcDeviceArray(TcDeviceArray&& other) noexcept : data_(other.data_), count_(other.count_) {
        other.data_ = nullptr;
        other.count_ = 0;
    }
    TcDeviceArray& operator=(TcDeviceArray&& other) noexcept {
        if (this != &other) {
            release();
            data_ = other.data_;
            count_ = other.count_;
            other.data_ = nullptr;
            other.count_ = 0;
        }
        return *this;
    }
    TcDeviceArray(const TcDeviceArray&) = delete;
    TcDeviceArray& operator=(const TcDeviceArray&) = delete;
    ~TcDeviceArray() { release(); }

    T* data() const { return data_; }
    std::size_t size() const { return count_; }
    std::size_t bytes() const { return count_ * sizeof(T); }

private:
    void release() {
        if (data_) cudaFree(data_);
        data_ = nullptr;
    }
    T* data_ = nullptr;
    std::size_t count_ = 0;
};

}  // namespace flashattn::tc
