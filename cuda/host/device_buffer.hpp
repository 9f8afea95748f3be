// cuda/host/device_buffer.hpp — an owning array in GPU memory (RAII around cudaMalloc / cudaFree).
//
// Every device allocation of the CUDA backends is a DeviceBuffer, so a prepared problem frees its
// memory however it ends (an exception included), and an allocation that fails is a
// std::runtime_error naming the size instead of a null pointer used later.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/host/check.hpp"

namespace flashattn::cuda {

template <class T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t count) : count_(count) {
        if (count == 0) return;
        if (count > std::size_t(-1) / sizeof(T))
            throw std::runtime_error("device buffer of " + std::to_string(count) +
                                     " elements overflows size_t");
        void* p = nullptr;
        const cudaError_t status = cudaMalloc(&p, bytes());
        if (status != cudaSuccess) {
            (void)cudaGetLastError();
            throw std::runtime_error("CUDA error: " + std::string(cudaGetErrorString(status)) +
                                     " allocating " + std::to_string(bytes()) +
                                     " bytes of device memory");
        }
        data_ = static_cast<T*>(p);
    }
    DeviceBuffer(DeviceBuffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
        if (this != &other) {
            release();
            data_ = std::exchange(other.data_, nullptr);
            count_ = std::exchange(other.count_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { release(); }

    T* data() { return data_; }
    const T* data() const { return data_; }
    std::size_t size() const { return count_; }
    std::size_t bytes() const { return count_ * sizeof(T); }

    // Host -> device copy of the whole buffer (count_ elements from `host`).
    void upload(const T* host) {
        if (count_) FA_CUDA_CHECK(cudaMemcpy(data_, host, bytes(), cudaMemcpyHostToDevice));
    }
    // Device -> host copy of the whole buffer.
    void download(T* host) const {
        if (count_) FA_CUDA_CHECK(cudaMemcpy(host, data_, bytes(), cudaMemcpyDeviceToHost));
    }
    // Every byte 0xFF: for float that is a NaN, so an element a kernel forgets to write shows.
    void poison() {
        if (count_) FA_CUDA_CHECK(cudaMemset(data_, 0xFF, bytes()));
    }

private:
    void release() {
        if (data_) (void)cudaFree(data_);  // never throws from a destructor
        data_ = nullptr;
        count_ = 0;
    }
    T* data_ = nullptr;
    std::size_t count_ = 0;
};

// A backend's working memory on the device (beyond inputs and outputs), counted as it is
// allocated: what PreparedAttention/PreparedBackward::extra_bytes() report.
class DeviceWorkspace {
public:
    template <class T>
    DeviceBuffer<T> allocate(std::size_t count) {
        DeviceBuffer<T> buffer(count);
        bytes_ += buffer.bytes();
        return buffer;
    }
    std::size_t bytes() const { return bytes_; }

private:
    std::size_t bytes_ = 0;
};

}  // namespace flashattn::cuda
