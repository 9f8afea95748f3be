// cpu/workspace.hpp — working memory that measures itself.
//
// The paper's memory claim is about the memory an algorithm needs beyond its inputs and outputs:
// standard attention materializes S and P (O(N^2)), FlashAttention only tiles (O(N)). Every
// buffer a CPU form allocates for its own work is a WorkBuffer, so `flashattn bench` can report
// the measured peak instead of a formula.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "common/memory.hpp"

namespace flashattn {

// Process-wide counters of live WorkBuffer bytes. Thread-safe.
class WorkspaceMeter {
public:
    static void reset_peak() { peak_.store(current_.load()); }
    static std::size_t peak() { return peak_.load(); }
    static std::size_t current() { return current_.load(); }

    static void add(std::size_t bytes) {
        const std::size_t now = current_.fetch_add(bytes) + bytes;
        std::size_t seen = peak_.load();
        while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
        }
    }
    static void remove(std::size_t bytes) { current_.fetch_sub(bytes); }

private:
    static inline std::atomic<std::size_t> current_{0};
    static inline std::atomic<std::size_t> peak_{0};
};

// A fixed-size, uninitialized array of T whose bytes are counted by WorkspaceMeter.
// An allocation that fails becomes std::runtime_error naming the bytes and `what` the buffer is
// for (common/memory.hpp's out_of_memory), never an abort. `what` must outlive the constructor
// only (a string literal, usually).
template <class T>
class WorkBuffer {
public:
    WorkBuffer() = default;
    explicit WorkBuffer(std::size_t count, const char* what = "working memory") : count_(count) {
        if (count == 0) return;
        if (count > std::size_t(-1) / sizeof(T))
            throw std::runtime_error(std::string(what) + " of " + std::to_string(count) +
                                     " elements overflows size_t");
        data_.reset(new (std::nothrow) T[count]);
        if (!data_) throw out_of_memory(double(count) * sizeof(T), what);
        WorkspaceMeter::add(bytes());
    }
    WorkBuffer(WorkBuffer&& other) noexcept
        : data_(std::move(other.data_)), count_(other.count_) {
        other.count_ = 0;
    }
    WorkBuffer& operator=(WorkBuffer&& other) noexcept {
        release();
        data_ = std::move(other.data_);
        count_ = other.count_;
        other.count_ = 0;
        return *this;
    }
    WorkBuffer(const WorkBuffer&) = delete;
    WorkBuffer& operator=(const WorkBuffer&) = delete;
    ~WorkBuffer() { release(); }

    T* data() { return data_.get(); }
    const T* data() const { return data_.get(); }
    T& operator[](std::size_t i) { return data_[i]; }
    const T& operator[](std::size_t i) const { return data_[i]; }
    std::size_t size() const { return count_; }
    T* begin() { return data(); }
    T* end() { return data() + count_; }
    const T* begin() const { return data(); }
    const T* end() const { return data() + count_; }
    std::size_t bytes() const { return count_ * sizeof(T); }

private:
    void release() {
        if (data_) WorkspaceMeter::remove(bytes());
        data_.reset();
        count_ = 0;
    }
    std::unique_ptr<T[]> data_;
    std::size_t count_ = 0;
};

}  // namespace flashattn
