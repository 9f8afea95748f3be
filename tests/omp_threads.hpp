// tests/omp_threads.hpp — the OpenMP thread count of the CPU forms, set for one scope.
#pragma once

#include <omp.h>

namespace flashattn::test {

// Sets the OpenMP thread count for one scope and restores it afterwards.
class ThreadCount {
public:
    explicit ThreadCount(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
    ~ThreadCount() { omp_set_num_threads(saved_); }
    ThreadCount(const ThreadCount&) = delete;
    ThreadCount& operator=(const ThreadCount&) = delete;

private:
    int saved_;
};

}  // namespace flashattn::test
